"""A task's config options are a pydantic model beside the task, registered into core.config's
sections (``register_options``): the YAML shape, the errors' key paths and the config ids are those
of one schema, and a plugin declares its own options the same way as the built-in tasks."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import Field

from core import config, config_id
from core.config import Options, PipelineConfig, config_from_dict, register_options
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# Every later key of the config id before the tasks' keys moved out of core/config.py: shared or a
# task's, each must stay one, or the id of every config that leaves it at its default moves.
LATER_BEFORE_THE_SPLIT = {
    ("dataset", "text"),
    ("model", "vocab_size"), ("model", "seq_len"), ("model", "d_model"), ("model", "n_layers"),
    ("model", "n_heads"), ("model", "d_ff"), ("model", "factory"), ("model", "kwargs"),
    ("training", "parallel"), ("training", "checkpoint_every"), ("training", "rendezvous"),
    ("training", "loader", "stream_above_mb"), ("training", "loader", "shuffle_row_groups"),
    ("training", "loader", "val_rows"), ("training", "loader", "csv_parquet_above_mb"),
    ("training", "compile"),
    ("dataset", "categorical"), ("dataset", "max_categories"), ("dataset", "leak_policy"),
    ("model", "layers"), ("model", "numeric"), ("model", "periodic"), ("model", "frequencies"),
    ("model", "frequency_scale"), ("model", "embedding_dim"),
    ("gates", "min_improvement"), ("gates", "max_gap_to_gbdt"),
    ("dataset", "images"), ("model", "weights"),
    ("training", "early_stopping", "restore_best"), ("dataset", "dates"), ("dataset", "date_parts"),
    ("primary_metric",), ("training", "class_weight"), ("gates", "allow_single_class"),
    ("pretrained",),
}


@pytest.fixture
def schema_restored():
    """Put core.config's schema back as it was after the test registered options of its own."""
    fields = {name: dict(cls.model_fields) for name, cls in config._SECTIONS.items()}
    options = {k: list(v) for k, v in config._OPTIONS.items()}
    checks = {k: list(v) for k, v in config._CHECKS.items()}
    later = dict(config_id._LATER)
    yield
    for name, cls in config._SECTIONS.items():
        cls.model_fields.clear()
        cls.model_fields.update(fields[name])
        cls.model_rebuild(force=True)
    PipelineConfig.model_rebuild(force=True)
    config._OPTIONS.update(options)
    config._CHECKS.update(checks)
    config_id._LATER.clear()
    config_id._LATER.update(later)


class Forecast(Options):
    """A plugin's section."""

    horizon: int = Field(24, gt=0)


class ForecastSection(Options):
    forecast: Forecast | None = None


class ForecastModel(Options):
    kernel: int = Field(5, gt=0)


def _cfg(**extra) -> PipelineConfig:
    return config_from_dict({"name": "f", "task": "forecast", "dataset": {"path": "d"}, **extra})


def test_every_later_key_before_the_split_is_still_one():
    assert LATER_BEFORE_THE_SPLIT - set(config_id._LATER) == set()


def test_a_plugin_options_model_joins_the_schema_with_its_key_paths(schema_restored):
    before = _cfg().config_id()
    register_options("", ForecastSection)
    register_options("model", ForecastModel)
    assert _cfg().config_id() == before  # a task's keys at their default leave every id where it was
    cfg = _cfg(forecast={"horizon": 12}, model={"kernel": 3})
    assert (cfg.forecast.horizon, cfg.model.kernel) == (12, 3)
    assert cfg.config_id() != before
    with pytest.raises(ConfigError, match=r"^forecast\.horizon: must be > 0, got 0$"):
        _cfg(forecast={"horizon": 0})
    with pytest.raises(ConfigError, match=r"^model\.kernal: unknown key \(did you mean model\.kernel\?\)$"):
        _cfg(model={"kernal": 3})


def test_a_key_its_section_already_has_is_refused(schema_restored):
    class Clash(Options):
        d_model: int = 8

    with pytest.raises(ValueError, match="model already has d_model"):
        register_options("model", Clash)


def test_a_config_validated_before_any_task_registered_fails_loudly(schema_restored):
    for models in config._OPTIONS.values():
        models.clear()
    with pytest.raises(RuntimeError, match="import tasks"):
        _cfg()


def test_task_keys_keep_their_key_paths_in_errors():
    with pytest.raises(ConfigError, match=r"^dataset\.images\.size: at least 4 x 4 pixels, got \[2, 2\]$"):
        config_from_dict({"name": "i", "dataset": {"path": "d", "images": {"size": [2, 2]}}})
    with pytest.raises(ConfigError, match=r"^dataset\.categorical: contains the label column 'label'"):
        config_from_dict({"name": "t", "dataset": {"path": "d", "categorical": ["label"]}})
    with pytest.raises(ConfigError, match=r"^model\.d_modle: unknown key \(did you mean model\.d_model\?\)$"):
        config_from_dict({"name": "l", "dataset": {"path": "d"}, "model": {"d_modle": 8}})


def test_options_modules_are_torch_free():
    for path in sorted((ROOT / "tasks").glob("*_options.py")):
        tops = {n.module.split(".")[0] for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.ImportFrom) and n.module}
        tops |= {a.name.split(".")[0] for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
                 for a in n.names}
        assert tops <= {"__future__", "typing", "pydantic", "core"}, path.name


def test_a_task_that_is_no_name_fails_as_a_key_not_in_the_plugin_loader():
    with pytest.raises(ConfigError, match=r"^task: input should be a valid string, got \['a'\]$"):
        config_from_dict({"name": "x", "task": ["a"], "dataset": {"path": "d"}})


def test_a_plugin_task_registers_its_options_before_its_config_validates(schema_restored, monkeypatch):
    import tasks
    from tasks.base import Task

    class EntryPoint:  # what importlib.metadata finds under trainflow.tasks for an installed plugin
        value = "trainflow_forecast:Forecast"

        def load(self):  # importing the plugin's module registers its options
            register_options("", ForecastSection)
            return type("Forecast", (Task,), {"name": "forecast"})

    monkeypatch.setattr(tasks, "_plugins", lambda: {"forecast": EntryPoint()})
    tasks.get_task.cache_clear()
    try:
        assert _cfg(forecast={"horizon": 6}).forecast.horizon == 6
    finally:
        tasks.get_task.cache_clear()
