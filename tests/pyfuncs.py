"""The models-from-code files of ``tasks/``, run from the source tree as the registry runs them to log."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

TASKS = Path(__file__).resolve().parents[1] / "tasks"


def pyfunc_module(file: str):
    """``tasks/<file>`` executed as MLflow executes a models-from-code file, with its ``pyfunc_common``
    found beside it (as the logged model's ``code/`` folder is found when it loads)."""
    spec = importlib.util.spec_from_file_location(f"{Path(file).stem}_under_test", TASKS / file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(TASKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TASKS))
    return module
