"""One GX runner, suites as plug-ins: no import cycle in validation/, unknown suites refused.
(Each module importing alone, in a fresh interpreter: tests/integration/test_validation_imports.py.)"""

from __future__ import annotations

import ast
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
    # The runner imports a suite only by the path a plan holds, and both suites use it.
    assert not graph["validation.gx_run"] & {"validation.suite", "validation.text_suite"}
    assert "validation.gx_run" in graph["validation.suite"] & graph["validation.text_suite"]


def test_a_plan_naming_an_unknown_suite_is_one_clear_error():
    from tasks.base import ValidationPlan
    from validation.gx_run import suite_key, suite_module

    paths = {"validation.suite": "table", "validation.text_suite": "text", "validation.image_suite": "image",
             "validation.pretrained_suite": "pretrained_text"}
    assert {p: suite_module(ValidationPlan(p, [], {})).NAME for p in paths} == paths
    with pytest.raises(ValueError, match=r"^validation plan: no suite module 'validation.audio_suite'$"):
        suite_key(ValidationPlan("validation.audio_suite", [], {}))
