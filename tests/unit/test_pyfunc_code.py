"""What a logged model runs imports no project code: its pyfunc file and the modules logged beside it
(``ModelSpec.code_paths``) load where trainflow is not installed."""

from __future__ import annotations

from tasks.base import PYFUNC_COMMON
from tasks.tabular import PYFUNC_CODE
from tests.unit.test_boundaries import ROOMS, ROOT, _imports


def test_pyfunc_files_and_the_modules_shipped_with_them_import_no_project_code():
    shipped = [*sorted((ROOT / "tasks").glob("pyfunc_*.py")), *PYFUNC_CODE]
    assert PYFUNC_COMMON in shipped and (ROOT / "tasks" / "encoding.py") in shipped
    bad = [f"{path.name}:{line} imports {name}" for path in shipped for line, name in _imports(path)
           if name.split(".")[0] in ROOMS]
    assert bad == []


def test_the_shared_input_checks_name_the_rows_the_column_and_the_methods():
    import pandas as pd
    import pytest

    from tasks import pyfunc_common as common

    assert common.texts(pd.DataFrame({"text": ["a", "b"]})) == ["a", "b"]
    with pytest.raises(ValueError, match=r"column 'text': rows \[1, 2\] are not text"):
        common.texts(pd.DataFrame({"text": ["a", 3, None]}))
    with pytest.raises(ValueError, match=r"a column 'text' of text, got \['prompt'\]"):
        common.texts(pd.DataFrame({"prompt": ["a"]}))
    assert common.method(None, ("generate", "score")) == "generate"
    with pytest.raises(ValueError, match="params.predict_method: must be one of generate, score, got 'predict_proba'"):
        common.method({"predict_method": "predict_proba"}, ("generate", "score"))
