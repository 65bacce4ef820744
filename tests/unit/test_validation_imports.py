"""One GX runner, suites as plug-ins: no import cycle in validation/, each module importable alone."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "validation"
MODULES = sorted(f"validation.{p.stem}" for p in VALIDATION.glob("*.py") if p.stem != "__init__")


def _imports(path: Path) -> set[str]:
    """Every validation module ``path`` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in MODULES}
    return out


def test_validation_modules_import_no_cycle():
    graph = {m: _imports(VALIDATION / f"{m.split('.')[1]}.py") for m in MODULES}

    def cycle_from(start: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for nxt in sorted(graph[start]):
            if nxt in seen:
                return (*seen[seen.index(nxt):], nxt)
            found = cycle_from(nxt, (*seen, nxt))
            if found:
                return found
        return None

    cycles = [c for m in MODULES if (c := cycle_from(m, (m,)))]
    assert not cycles, f"import cycle: {' -> '.join(cycles[0])}"
    # The runner names its suites only as data, and both suites use it.
    assert not graph["validation.gx_run"] & {"validation.suite", "validation.text_suite"}
    assert "validation.gx_run" in graph["validation.suite"] & graph["validation.text_suite"]


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


def test_a_plan_naming_an_unknown_suite_is_one_clear_error():
    from tasks.base import ValidationPlan
    from validation.gx_run import SUITES, suite_key, suite_module

    assert {name: suite_module(name).NAME for name in SUITES} == {"table": "table", "text": "text", "image": "image"}
    with pytest.raises(ValueError, match=r"^validation plan: unknown suite 'audio'; known: table, text, image$"):
        suite_key(ValidationPlan("audio", [], {}))
