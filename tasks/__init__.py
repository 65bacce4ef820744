"""Tasks: the one place that knows a kind of problem (see ``tasks.base``).

Built in: ``classification`` and ``regression`` of a table's named columns, ``lm`` (a byte-level
language model of a text corpus) and ``image_classification`` (a folder of images). A package adds
its own under the entry-point group ``trainflow.tasks`` (``name = "module:TaskClass"``). A task is
chosen once, by the config's ``task`` key; configs are committed files, never deployment parameters.
"""

from __future__ import annotations

import functools
from importlib import import_module

from core import config
from core.errors import ConfigError
# Each built-in task's config options join core.config's schema when its module is imported.
from tasks import image_options, lm_options, pretrained_options, table_options  # noqa: F401

ENTRY_POINT_GROUP = "trainflow.tasks"
BUILTIN = {
    "classification": "tasks.tabular:Classification",
    "regression": "tasks.tabular:Regression",
    "lm": "tasks.lm:LanguageModel",
    "image_classification": "tasks.images:ImageClassification",
    "causal_lm": "tasks.causal_lm:CausalLM",
    "text_classification": "tasks.text_classification:TextClassification",
}


def _plugins() -> dict:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def names() -> list[str]:
    """Every task this environment has: the built-ins, then the entry points' (sorted)."""
    return [*BUILTIN, *sorted(set(_plugins()) - set(BUILTIN))]


@functools.cache
def get_task(name: str):
    """The task called ``name``: a built-in, else one registered under ``trainflow.tasks``; ConfigError
    (``task: ...``) naming what is available. One instance per name in a process, so what it has read
    serves every stage."""
    from tasks.base import Task

    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        obj = getattr(import_module(module), attr)
    else:
        plugins = _plugins()
        if name not in plugins:
            known = sorted(BUILTIN) + sorted(plugins)
            raise ConfigError(f"task: unknown task {name!r}; available: {', '.join(known)} "
                              f"(a package adds one under the {ENTRY_POINT_GROUP!r} entry-point group)")
        try:
            obj = plugins[name].load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is a config problem to report
            raise ConfigError(f"task: {name!r} could not be loaded from {plugins[name].value}: "
                              f"{type(exc).__name__}: {exc}") from None
    task = obj() if isinstance(obj, type) else obj
    if not isinstance(task, Task):
        raise ConfigError(f"task: {name!r} is not a tasks.base.Task (got {type(task).__name__})")
    return task


# A plugin task's module is imported before its config validates, so the options it registers are known.
config.TASK_LOADERS.append(lambda name: isinstance(name, str) and name not in BUILTIN and name in _plugins()
                           and get_task(name))


def task_for(cfg):
    """The config's task, after checking that the config fits it (ConfigError naming the key)."""
    task = get_task(cfg.task)
    task.check_config(cfg)
    return task
