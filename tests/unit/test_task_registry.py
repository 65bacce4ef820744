"""``tasks.get_task``: built-ins by name, plugins from the ``trainflow.tasks`` entry-point group, and
a ConfigError naming the way out for an unknown name or a plugin that cannot be loaded. The
installed plugins are replaced by fakes, so these tests do not depend on what is installed."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

import tasks
from core.errors import ConfigError
from tasks.base import Task


class _Toy(Task):
    name = "toy"


NOT_A_TASK = object()


def _plugins(monkeypatch, **refs: str) -> None:
    eps = {name: EntryPoint(name=name, value=ref, group=tasks.ENTRY_POINT_GROUP) for name, ref in refs.items()}
    monkeypatch.setattr(tasks, "_plugins", lambda: eps)


def test_unknown_task_lists_builtins_and_plugins(monkeypatch):
    _plugins(monkeypatch, toy=f"{__name__}:_Toy")
    with pytest.raises(ConfigError) as err:
        tasks.get_task("timeseries")
    msg = str(err.value)
    assert msg.startswith("task: unknown task 'timeseries'; available: causal_lm, classification, image_classification, lm, regression, text_classification, toy")
    assert "'trainflow.tasks' entry-point group" in msg


def test_plugin_task_is_loaded_and_instantiated(monkeypatch):
    _plugins(monkeypatch, toy=f"{__name__}:_Toy")
    assert isinstance(tasks.get_task("toy"), _Toy)


def test_builtin_name_wins_over_a_plugin_of_the_same_name(monkeypatch):
    _plugins(monkeypatch, regression=f"{__name__}:_Toy")
    assert type(tasks.get_task("regression")).__name__ == "Regression"


@pytest.mark.parametrize("ref, why", [
    ("no_such_module_for_trainflow_tests:Task", "ModuleNotFoundError: No module named 'no_such_module_for_trainflow_tests'"),
    (f"{__name__}:Missing", "AttributeError"),
])
def test_broken_entry_point_is_a_config_error_naming_it(monkeypatch, ref, why):
    _plugins(monkeypatch, broken=ref)
    with pytest.raises(ConfigError) as err:
        tasks.get_task("broken")
    msg = str(err.value)
    assert msg.startswith(f"task: 'broken' could not be loaded from {ref}: ")
    assert why in msg


def test_entry_point_that_is_not_a_task_is_refused(monkeypatch):
    _plugins(monkeypatch, odd=f"{__name__}:NOT_A_TASK")
    with pytest.raises(ConfigError, match=r"^task: 'odd' is not a tasks\.base\.Task \(got object\)"):
        tasks.get_task("odd")
