"""``sequence-forecast``: predict the next value of a series from a window of its last values.

A row is one window (feature columns oldest first) and its label, the next value. The task is a
plain ``Task``: it brings its own suite (``trainflow_timeseries.suite``), evaluator
(``trainflow_timeseries.evaluate``), loader and metrics, and asks a ``Regression`` it holds (not one it
is) for the table's reading and the pyfunc; what it replaces, and why, is the README's table. The
evaluation targets are ``[n, 2]``: the next value and the last observed one, which
``directional_accuracy`` needs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.errors import ConfigError, DataUnavailableError
from tasks.base import Metric, Task, ValidationPlan
from tasks.tabular import Regression, TableInfo

if TYPE_CHECKING:
    from core.config import PipelineConfig

DEFAULT_FACTORY = "trainflow_timeseries.model:conv_forecaster"
DEFAULT_KWARGS = {"channels": 16, "kernel": 5, "hidden": 32}
# Bump when a metric's definition changes: recorded champion scores then stop matching.
METRICS_VERSION = 1
# ModelConfig keys of trainflow's built-in networks, which this task does not build.
_BUILTIN_MODEL_KEYS = ("kind", "channels", "hidden", "dropout")


def _held(name: str):
    """A method that asks the task's held table (``SequenceForecast.table``) the same question."""
    def ask(self, *args, **kwargs):
        return getattr(self.table, name)(*args, **kwargs)

    ask.__name__ = name
    return ask


class SequenceForecast(Task):
    """One-step forecasting of a window of a time series (see the module docstring)."""

    name = "sequence-forecast"
    info_type = TableInfo
    metrics = (Metric("smape", False, relative=True), Metric("directional_accuracy", True),
               Metric("rmse", False), Metric("mae", False), Metric("latency_p95_ms", False))
    champion_metrics = ("smape", "directional_accuracy")
    primary = "smape"

    def __init__(self):
        # The CSV reader, the scoring key and the pyfunc, under this task's name, metrics and their version.
        self.table = Regression()
        for key in ("name", "metrics", "champion_metrics", "primary"):
            setattr(self.table, key, getattr(self, key))
        self.table.metrics_version = METRICS_VERSION

    # What a table answers, answered by the held ``Regression``: frames, scoring key, pyfunc, trees, init.
    frames, data_splits, scoring_key = _held("frames"), _held("data_splits"), _held("scoring_key")
    model_spec, check_program, check_program_output = _held("model_spec"), _held("check_program"), \
        _held("check_program_output")
    example_input, loss, decode = _held("example_input"), _held("loss"), _held("decode")
    write_test_scores, gbdt, drift_frames = _held("write_test_scores"), _held("gbdt"), _held("drift_frames")
    init_fit, init_table = _held("init_fit"), _held("init_table")

    # -- config --------------------------------------------------------------------------------
    def check_config(self, cfg: "PipelineConfig") -> None:
        self.table.check_config(cfg)
        if cfg.dataset.file is not None:
            raise ConfigError("dataset.file: a time series is split by time, not by a seeded shuffle of its "
                              "windows; give train_file and test_file (trainflow_timeseries.data writes both)")
        if cfg.dataset.features is not None and len(cfg.dataset.features) < 2:
            raise ConfigError("dataset.features: a window needs at least 2 past values, oldest first")
        if cfg.model.factory is None:
            # Compared with the defaults, not by which keys were written: the training job reads
            # back a config dumped whole, every key present.
            defaults = type(cfg.model)()
            set_builtin = [k for k in _BUILTIN_MODEL_KEYS if getattr(cfg.model, k) != getattr(defaults, k)]
            if set_builtin:
                raise ConfigError(f"model.{set_builtin[0]}: task {self.name!r} does not build trainflow's cnn/mlp; "
                                  f"its network is model.factory (default {DEFAULT_FACTORY}) with model.kwargs")
            unknown = sorted(set(cfg.model.kwargs) - set(DEFAULT_KWARGS))
            if unknown:
                raise ConfigError(f"model.kwargs.{unknown[0]}: not an argument of {DEFAULT_FACTORY}; "
                                  f"it takes {', '.join(DEFAULT_KWARGS)}")

    def init_defaults(self) -> dict:
        return {"model": {"kwargs": dict(DEFAULT_KWARGS)},
                "gates": {"baseline_margin": 0.2,
                          "thresholds": {"smape": 3.0, "directional_accuracy": 0.6, "latency_p95_ms": 50}}}

    # -- validation and evaluation: this package's own ----------------------------------------
    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        plan = self.table.validation_plan(cfg, root)
        return ValidationPlan("trainflow_timeseries.suite", plan.files, plan.params)

    def evaluator(self):
        from trainflow_timeseries import evaluate

        return evaluate

    # -- data ----------------------------------------------------------------------------------
    def info(self, cfg: "PipelineConfig", root: Path) -> TableInfo:
        info = self.table.info(cfg, root)
        if len(info.features) < 2:
            raise DataUnavailableError(f"a window needs at least 2 past values, got columns {info.features}")
        return info

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        """Raw targets (WindowNorm scales each window and its target together); per-epoch validation on
        the train file's last ``val_fraction`` of rows (its most recent windows, the file being in time
        order), so early stopping looks ahead in time, as the test split does."""
        from tasks.splits import Splits, tensors

        p, info = self.table.prepared(cfg, root), self.info(cfg, root)
        x, y, n = p["x"], p["y"], len(p["y"])
        cut = n - min(max(1, math.ceil(n * cfg.dataset.val_fraction)), n - 1)
        return Splits(train=tensors(x[:cut], y[:cut]), val=tensors(x[cut:], y[cut:]),
                      test=tensors(p["xt"], p["yt"]), info=info)

    def val_accuracy(self, correct: float, n: int) -> None:
        return None

    # -- model ---------------------------------------------------------------------------------
    def build_model(self, cfg: "PipelineConfig", info: TableInfo):
        from torch import nn

        from trainflow_timeseries.model import WindowNorm
        from tasks.factory import load_factory

        ref = cfg.model.factory or DEFAULT_FACTORY
        kwargs = cfg.model.kwargs if cfg.model.factory else {**DEFAULT_KWARGS, **cfg.model.kwargs}
        net = load_factory(ref)(len(info.features), 1, **kwargs)
        if not isinstance(net, nn.Module):
            raise ValueError(f"model.factory: {ref} returned {type(net).__name__}, not an nn.Module")
        return WindowNorm(net)

    def export_module(self, model, info: TableInfo):
        return model  # already in the series' units

    # -- the per-row hooks its evaluator uses --------------------------------------------------------
    def eval_data(self, cfg: "PipelineConfig", root: Path):
        """(test frame, windows float32, targets ``[n, 2]`` = (next value, last observed), info)."""
        frame, x, _, info = self.table.eval_data(cfg, root)
        # Both as the file holds them (float64, not the model's float32): a row whose next value
        # equals its last one is "no change", exactly as the persistence baseline predicts it.
        y = frame[[cfg.dataset.label, info.features[-1]]].to_numpy(dtype=np.float64)
        return frame, x, y, info

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        frame, _, y, info = self.eval_data(cfg, root)
        return self.score(y, np.asarray(predictor(frame[info.features]), dtype=np.float64).ravel(), info)

    def score(self, y: np.ndarray, pred: np.ndarray, info: TableInfo) -> dict:
        from trainflow_timeseries.metrics import forecast_metrics

        y = np.asarray(y, dtype=np.float64)
        return forecast_metrics(y[:, 0], pred, y[:, 1])

    def baseline(self, cfg, root, info: TableInfo, n: int) -> tuple[str, np.ndarray]:
        """Persistence: each window's last value is its forecast (``n`` test rows)."""
        test = self.frames(cfg, root)["test"]
        last = info.features[-1]
        return f"persistence (the next value is {last})", test[last].to_numpy(dtype=np.float64)

