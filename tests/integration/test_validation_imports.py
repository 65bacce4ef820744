"""Each validation module imports alone, in a fresh interpreter (pytest's own has them all loaded
already): the runner loads no suite, a suite only the runner and the report, none of them GX,
pandas or torch. (The import graph itself: tests/unit/test_validation_imports.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

MODULES = sorted(f"validation.{p.stem}" for p in (ROOT / "validation").glob("*.py") if p.stem != "__init__")


def test_each_validation_module_imports_alone_in_a_fresh_interpreter():
    code = (
        "import importlib, json, sys\n"
        f"mods = {MODULES!r}\n"
        "out = {}\n"
        "for m in mods:\n"
        "    for k in [k for k in sys.modules if k == 'validation' or k.startswith('validation.')]:\n"
        "        del sys.modules[k]\n"
        "    importlib.import_module(m)\n"
        "    out[m] = sorted(k for k in sys.modules if k.startswith('validation.'))\n"
        "out['heavy'] = sorted({'great_expectations', 'pandas', 'torch'} & set(sys.modules))\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert loaded.pop("heavy") == []
    # Importing the runner loads no suite; a suite loads the runner and the report, nothing else.
    assert loaded["validation.gx_run"] == ["validation.gx_run", "validation.report"]
    for suite in ("validation.suite", "validation.text_suite", "validation.image_suite"):
        assert loaded[suite] == sorted([suite, "validation.gx_run", "validation.report"])
