"""Tabular tasks: classification and regression of a table's named columns.

The data is a CSV or Parquet table (``tasks.table``); the features are float or integer
columns by name, the label a class (integer or string) or a float target. Standardisation
statistics are fitted on the train split and baked into the model as its first layer, so the
exported program (and the registered pyfunc) takes the raw columns by name, as the user's
DataFrame holds them. The class set comes from the reviewed expectations file (its label's
``values``), in the order of the model's outputs; ``predict`` returns the original labels.
A regression model is trained on standardised targets and exported with the de-scaling inside.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from core.errors import ConfigError, DataUnavailableError
from core.expectations import load_expectations
from tasks.base import SCORES_FILE, Metric, ModelSpec, Task, ValidationPlan, load_program
from tasks.table import feature_columns, load_frames, split_paths

if TYPE_CHECKING:
    import pandas as pd

    from core.config import PipelineConfig

# Bump when a metric's definition or computation changes: recorded champion scores then stop matching
# (a task's ``metrics_version``; a subclass with metrics of its own sets its own).
METRICS_VERSION = 2
PYFUNC_FILE = Path(__file__).with_name("pyfunc_table.py")


def _mlflow_type(dtype) -> str:
    import pandas as pd

    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_integer_dtype(dtype):
        return "long"
    if pd.api.types.is_numeric_dtype(dtype):
        return "double"
    return "string"


def _label_key(value) -> str:
    """Labels compare as text: 3 in a CSV and 3 in the YAML class set are the same class."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


class _Table(Task):
    """What classification and regression share: reading, features, scaling, the pyfunc."""

    classification: ClassVar[bool] = True
    evaluator: ClassVar[str] = "predictions"
    metrics_version: ClassVar[int] = METRICS_VERSION

    # -- config -----------------------------------------------------------------------------
    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        if cfg.dataset.text is not None:
            raise ConfigError(f"dataset.text: only for the lm task, but task is {self.name!r}")
        if cfg.model.kind == "lm" and cfg.model.factory is None:
            raise ConfigError(f"model.kind: 'lm' is the lm task's model; task {self.name!r} takes cnn, mlp "
                              "or model.factory")
        if cfg.dataset.expectations_file is None:
            raise ConfigError("dataset.expectations_file: required for a table (`trainflow init` writes one; "
                              "review and commit it)")
        if cfg.model.factory is not None:
            _check_factory(cfg.model.factory)

    def _cached(self, key, make):
        """One remembered value per kind of key (the last one): the flow's stages ask for the same
        frames and expectations file several times (~0.1 s each for a CSV); the key holds the
        files' identity, so an edited file is read again."""
        cache = self.__dict__.setdefault("_cache", {})
        if cache.get(key[0], (None,))[0] != key:
            cache[key[0]] = (key, make())
        return cache[key[0]][1]

    def expectations(self, cfg: "PipelineConfig", root: Path):
        """The reviewed expectations file, or None when the config names none (a sizing probe)."""
        if cfg.dataset.expectations_file is None:
            return None
        path = Path(root) / cfg.dataset.expectations_file
        return self._cached(("expectations", _file_id(path)), lambda: load_expectations(path))

    def _features(self, cfg: "PipelineConfig", columns: list[str]) -> list[str]:
        return feature_columns(cfg.dataset, columns)

    # -- validation ---------------------------------------------------------------------------
    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        exp = self.expectations(cfg, root)
        files = [*split_paths(cfg.dataset, root).values(), Path(root) / cfg.dataset.expectations_file]
        return ValidationPlan("table", files, {
            "dataset": cfg.dataset, "root": Path(root), "seed": cfg.seed, "stratify": self.classification, "expectations": exp,
            "features": self._features(cfg, exp.names), "label": cfg.dataset.label,
            "classification": self.classification})

    def data_splits(self, cfg: "PipelineConfig") -> dict[str, tuple[str, str]]:
        files = cfg.dataset.split_files  # one ``all`` file is split by seed into both
        base = cfg.dataset.path.rstrip("/")
        return {"train": (f"{base}/{files.get('train', files.get('all'))}", "training"),
                "test": (f"{base}/{files.get('test', files.get('all'))}", "testing")}

    # -- data ---------------------------------------------------------------------------------
    def frames(self, cfg: "PipelineConfig", root: Path) -> dict[str, "pd.DataFrame"]:
        """``{"train", "test"}`` frames as the files hold them (shared: callers must not modify them)."""
        return self._cached(self._frames_key(cfg, root),
                            lambda: load_frames(cfg.dataset, root, cfg.seed, stratify=self.classification))

    def _frames_key(self, cfg: "PipelineConfig", root: Path) -> tuple:
        paths = split_paths(cfg.dataset, root)
        return ("frames", tuple(_file_id(p) for p in paths.values()), cfg.dataset.model_dump_json(), cfg.seed,
                self.classification)

    def info(self, cfg: "PipelineConfig", root: Path, frames: dict | None = None) -> dict:
        """What the model and the registry need to know of the data, fitted on the train split
        (JSON-able): features and their MLflow types, the class set or the target's scale, and
        per-feature mean and std (a constant column gets std 1)."""
        if frames is None:
            return self.prepared(cfg, root)["info"]
        train = frames["train"]
        features = self._features(cfg, [str(c) for c in train.columns])
        missing = [c for c in [*features, cfg.dataset.label] if c not in train.columns]
        if missing:
            raise DataUnavailableError(f"train split lacks column(s) {missing}; found {list(train.columns)}")
        x = _numeric(train, features)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-null column: mean 0, std 1
            mean, std = np.nanmean(x, axis=0), np.nanstd(x, axis=0)
        info = {"features": features,
                "dtypes": {c: _mlflow_type(train[c].dtype) for c in features},
                "mean": np.nan_to_num(mean).tolist(), "std": np.where(std > 0, std, 1.0).tolist()}
        info.update(self._target_info(cfg, root, train[cfg.dataset.label]))
        return info

    def stream_info(self, cfg: "PipelineConfig", root: Path, source: Path, names: tuple, types: dict) -> dict:
        """``info`` of a train split too large to load (the streamed loader's): the same keys as
        ``info``, fitted in one pass of column statistics over ``source`` (a Parquet file or folder;
        ``names``/``types``: its columns and their pyarrow types), holding one batch at a time."""
        from tasks.columnar import column_stats, iter_batches

        features = self._features(cfg, [str(c) for c in names])
        missing = [c for c in [*features, cfg.dataset.label] if c not in names]
        if missing:
            raise DataUnavailableError(f"train split lacks column(s) {missing}; found {list(names)}")
        label = cfg.dataset.label
        cats = [label] if self.classification else []
        stats = column_stats(iter_batches(source, [*features, label]), [*features, label], categories=cats)
        bad = [c for c in features if stats[c].numeric is False]
        if bad:
            raise DataUnavailableError(f"feature columns must be numeric: {bad[:5]}")
        mean = [stats[c].mean if stats[c].count else 0.0 for c in features]
        std = [stats[c].std if stats[c].count and stats[c].std > 0 else 1.0 for c in features]
        info = {"features": features, "dtypes": {c: _mlflow_type(types[c].to_pandas_dtype()) for c in features},
                "mean": mean, "std": std}
        info.update(self._stream_target_info(cfg, root, stats[label]))
        return info

    def arrays(self, frame: "pd.DataFrame", info: dict, label: str) -> tuple[np.ndarray, np.ndarray]:
        """(features float32 [n, f], targets) of a frame: class indices int64 or float32 values."""
        return _numeric(frame, info["features"]).astype(np.float32), self.targets(frame[label], info)

    def prepared(self, cfg: "PipelineConfig", root: Path) -> dict:
        """``{"x", "y", "xt", "yt", "info"}``: both splits as arrays (targets encoded, not yet
        standardised) and ``info``, cached in ``TRAINFLOW_HOME/cache/tables`` as ``.npz`` + JSON
        (numpy only, never pickle). Saves each training worker reading the table with pandas (its
        import alone is ~0.45 s of CPU per rank, paid while the pipeline's server boots) on every
        run of the same data; the key holds the files' bytes, the config's dataset, seed and code."""
        import hashlib
        import inspect
        import os

        from core.hashing import file_sha256, sha256_json
        from core.paths import trainflow_home

        files = [*split_paths(cfg.dataset, root).values()]
        if cfg.dataset.expectations_file:
            files.append(Path(root) / cfg.dataset.expectations_file)
        code = {Path(__file__), Path(inspect.getfile(type(self))), Path(__file__).with_name("table.py")}
        key = sha256_json({"task": self.name, "seed": cfg.seed, "dataset": cfg.dataset.model_dump(mode="json"),
                           "files": [file_sha256(f) if f.is_file() else str(f) for f in files],
                           "code": sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in code)})
        folder = trainflow_home(Path(root)) / "cache" / "tables"
        npz, meta = folder / f"{key[:32]}.npz", folder / f"{key[:32]}.json"
        try:
            with np.load(npz, allow_pickle=False) as arrays:
                out = {k: arrays[k] for k in ("x", "y", "xt", "yt")}
            return {**out, "info": json.loads(meta.read_text())}
        except (OSError, ValueError, KeyError):
            pass
        frames = self.frames(cfg, root)
        info = self.info(cfg, root, frames)
        # A missing feature value (where the expectations allow nulls) is imputed with the train
        # mean by the model's first layer (``Standardize``), in training and in the exported program.
        x, y = self.arrays(frames["train"], info, cfg.dataset.label)
        xt, yt = self.arrays(frames["test"], info, cfg.dataset.label)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tag = f".{os.getpid()}.tmp"
            with open(str(npz) + tag, "wb") as fh:
                np.savez(fh, x=x, y=y, xt=xt, yt=yt)
            Path(str(meta) + tag).write_text(json.dumps(info))
            os.replace(str(meta) + tag, meta)  # the JSON first: an .npz is only read beside its info
            os.replace(str(npz) + tag, npz)
        except OSError:  # a read-only home: no cache, same arrays
            pass
        return {"x": x, "y": y, "xt": xt, "yt": yt, "info": info}

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        from training.data import Splits, tensors

        p = self.prepared(cfg, root)
        x, y, info = p["x"], p["y"], p["info"]
        keep, hold = self.holdout(y, cfg, seed)
        y, yt = self.train_targets(y, info), self.train_targets(p["yt"], info)
        return Splits(train=tensors(x[keep], y[keep]), val=tensors(x[hold], y[hold]), test=tensors(p["xt"], yt),
                      info=info)

    def holdout(self, y: np.ndarray, cfg: "PipelineConfig", seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Train-split row indices ``(keep, held out for per-epoch validation)``: a seeded
        ``val_fraction``, stratified by class for a classifier. A task with ordered rows (a time
        series) overrides it."""
        from training.data import stratified_holdout

        groups = y if self.classification else np.zeros(len(y), dtype=np.int64)
        return stratified_holdout(groups, cfg.dataset.val_fraction, seed)

    def train_targets(self, y: np.ndarray, info: dict) -> np.ndarray:
        return y

    # -- model --------------------------------------------------------------------------------
    def build_model(self, cfg: "PipelineConfig", info: dict):
        from torch import nn

        from training.models import Standardize, build_core

        n_in = len(info["features"])
        return nn.Sequential(Standardize(info["mean"], info["std"]), build_core(cfg.model, n_in, self.n_outputs(info)))

    def example_input(self, cfg: "PipelineConfig", info: dict, batch: int = 2):
        """A batch of train means (what ``Standardize`` maps to zeros)."""
        import torch

        return torch.tensor([info["mean"]] * batch, dtype=torch.float32)

    # -- evaluation hooks (the "predictions" evaluator) ----------------------------------------
    def eval_data(self, cfg: "PipelineConfig", root: Path) -> tuple["pd.DataFrame", np.ndarray, np.ndarray, dict]:
        """(test frame, features float32, targets, info) of the evaluation split.

        The targets are opaque to the evaluator: it only hands them to ``score`` (with the
        candidate's, the champion's or the baseline's predictions), so a task may pack in what
        its metrics need besides the truth (a forecaster: each row's last observed value)."""
        p = self.prepared(cfg, root)
        return self.frames(cfg, root)["test"], p["xt"], p["yt"], p["info"]

    def write_test_scores(self, cfg: "PipelineConfig", root: Path, out: Path) -> None:
        """Rank 0: ``out/model.pt2``'s predictions on the test split and its one-row latency, with
        the hashes of the program and the split, into ``test_scores.json`` (read back by the
        evaluation only when both still match)."""
        import time

        import torch

        from core.hashing import file_sha256

        x = self.prepared(cfg, root)["xt"]
        program = load_program(Path(out) / "model.pt2")
        xt = torch.as_tensor(x)
        times = []
        with torch.no_grad():
            outputs = program(xt).numpy()
            for i in range(220):  # 20 warm-up calls, then 200 timed one-row calls
                t0 = time.perf_counter()
                program(xt[i % len(xt)][None, :]).numpy()
                if i >= 20:
                    times.append((time.perf_counter() - t0) * 1000)
        scores = {"pred": self.decode(outputs).tolist(), "outputs_shape": list(outputs.shape), "latency_ms": times,
                  "threads": torch.get_num_threads(), "model_sha256": file_sha256(Path(out) / "model.pt2"),
                  "split_sha256": self.scoring_key(cfg, root)["split_sha256"]}
        tmp = Path(out) / (SCORES_FILE + ".tmp")
        tmp.write_text(json.dumps(scores))
        tmp.replace(Path(out) / SCORES_FILE)

    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        from core.hashing import file_sha256, sha256_json

        files = {k: file_sha256(p) for k, p in sorted(split_paths(cfg.dataset, root).items())}
        # The test split's identity: its file, or the one file with the seed and fraction that split it.
        split = sha256_json({"files": files, **({"seed": cfg.seed, "test_fraction": cfg.dataset.test_fraction}
                                                 if "all" in files else {})})
        parts = {"task": self.name, "split_sha256": split, "metrics_version": self.metrics_version,
                 "label": cfg.dataset.label, **self._key_parts(cfg, root)}
        return {"key": sha256_json(parts), "split_sha256": split, "metrics_version": self.metrics_version}

    def _key_parts(self, cfg, root) -> dict:
        return {}

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        frame, _, y, info = self.eval_data(cfg, root)
        return self.score(y, self.encode(predictor(frame[info["features"]]), info), info)

    # -- registry -------------------------------------------------------------------------------
    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        frame, _, _, info = self.eval_data(cfg, root)
        example = frame[info["features"]].head(5).reset_index(drop=True)
        meta = {"format": "torch.export", "input_dtype": "float32", "feature_columns": info["features"],
                **self._meta(info)}
        return ModelSpec(PYFUNC_FILE, meta, [(c, info["dtypes"][c]) for c in info["features"]],
                         [(None, self._output_type(info))], example,
                         checked=report.get("candidate_scored_in") == "worker")

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        import torch

        program = load_program(model_pt2)
        missing = [c for c in spec.meta["feature_columns"] if c not in spec.example.columns]
        if missing:
            raise ValueError(f"the input example lacks feature columns {missing[:5]}")
        x = torch.tensor(spec.example[spec.meta["feature_columns"]].head(5).to_numpy(dtype=np.float32))
        with torch.inference_mode():
            out = program(x).numpy()
        n = len(spec.meta.get("class_labels") or [None])
        if out.ndim != 2 or out.shape != (len(x), n):
            raise ValueError(f"{model_pt2}: maps [{len(x)}, {x.shape[1]}] inputs to {list(out.shape)}, "
                             f"expected [{len(x)}, {n}]")

    def check_program_output(self, out: np.ndarray, info: dict) -> None:
        """Raise ValueError when a program's output on a batch does not fit this task."""
        want = self.n_outputs(info)
        if out.ndim != 2 or out.shape[1] != want:
            raise ValueError(f"the program gives outputs of shape {list(out.shape)}, expected [rows, {want}]")


class Classification(_Table):
    name = "classification"
    metrics = (Metric("accuracy", True), Metric("macro_f1", True), Metric("min_class_recall", True),
               Metric("latency_p95_ms", False))
    champion_metrics = ("accuracy", "macro_f1")
    primary = "accuracy"

    def recorded_keys(self) -> tuple[str, ...]:
        return ("accuracy", "macro_f1", "min_class_recall", "class_recall", "confusion_matrix", "n")

    def init_defaults(self) -> dict:
        return {"model": {"kind": "mlp", "hidden": 64, "dropout": 0.1},
                "gates": {"baseline_margin": 0.05, "thresholds": {"latency_p95_ms": 50}}}

    def _target_info(self, cfg, root, labels) -> dict:
        exp = self.expectations(cfg, root)
        classes = exp.classes if exp is not None else None
        if classes is None:  # no reviewed class set: the train split's, sorted
            classes = sorted({v for v in labels.dropna().tolist()}, key=_label_key)
        if len(classes) < 2:
            raise ConfigError(f"{cfg.dataset.expectations_file}: the label {cfg.dataset.label!r} needs at least "
                              f"two classes, got {classes}")
        return {"classes": [c.item() if hasattr(c, "item") else c for c in classes]}

    def _stream_target_info(self, cfg, root, stats) -> dict:
        import pandas as pd

        return self._target_info(cfg, root, pd.Series(sorted(stats.values or {}, key=_label_key)))

    def n_outputs(self, info: dict) -> int:
        return len(info["classes"])

    def targets(self, labels, info: dict) -> np.ndarray:
        index = {_label_key(c): i for i, c in enumerate(info["classes"])}
        keys = [_label_key(v) for v in labels.tolist()]
        bad = sorted({k for k in keys if k not in index})
        if bad:
            raise DataUnavailableError(f"label values {bad[:5]} are outside the recorded class set "
                                       f"{info['classes']}")
        return np.asarray([index[k] for k in keys], dtype=np.int64)

    def encode(self, labels, info: dict) -> np.ndarray:
        """A registered model's predicted labels -> class indices (-1: not a known class)."""
        index = {_label_key(c): i for i, c in enumerate(info["classes"])}
        return np.asarray([index.get(_label_key(v), -1) for v in np.asarray(labels).tolist()], dtype=np.int64)

    def loss(self, out, y, reduction: str = "mean"):
        from training.models import token_loss

        return token_loss(out, y, reduction)

    def val_correct(self, out, y) -> float:
        return (out.argmax(-1) == y).sum().item()

    def decode(self, outputs: np.ndarray) -> np.ndarray:
        return np.asarray(outputs).argmax(1)

    def score(self, y: np.ndarray, pred: np.ndarray, info: dict) -> dict:
        from tasks.metrics import classification_metrics

        return classification_metrics(y, pred, len(info["classes"]))

    def baseline(self, cfg, root, info: dict, n: int) -> tuple[str, np.ndarray]:
        """The trivial predictor: the train split's majority class, for ``n`` rows."""
        train = self.frames(cfg, root)["train"]
        y = self.targets(train[cfg.dataset.label], info)
        majority = int(np.bincount(y, minlength=len(info["classes"])).argmax())
        return f"majority class {info['classes'][majority]!r}", np.full(n, majority, dtype=np.int64)

    def _key_parts(self, cfg, root) -> dict:
        return {"classes": [_label_key(c) for c in self.prepared(cfg, root)["info"]["classes"]]}

    def _meta(self, info: dict) -> dict:
        return {"output": "label", "class_labels": info["classes"]}

    def _output_type(self, info: dict) -> str:
        return "string" if any(isinstance(c, str) for c in info["classes"]) else "long"


class Regression(_Table):
    name = "regression"
    classification = False
    has_accuracy = False
    metrics = (Metric("r2", True), Metric("rmse", False), Metric("mae", False), Metric("latency_p95_ms", False))
    champion_metrics = ("r2", "rmse")
    primary = "r2"

    def init_defaults(self) -> dict:
        return {"model": {"kind": "mlp", "hidden": 64, "dropout": 0.0},
                "gates": {"baseline_margin": 0.1, "thresholds": {"latency_p95_ms": 50}}}

    def _target_info(self, cfg, root, labels) -> dict:
        y = labels.to_numpy(dtype=np.float64, na_value=np.nan)
        y = y[np.isfinite(y)]
        std = float(y.std()) if len(y) else 1.0
        return {"y_mean": float(y.mean()) if len(y) else 0.0, "y_std": std if std > 0 else 1.0}

    def _stream_target_info(self, cfg, root, stats) -> dict:
        std = stats.std if stats.count else 1.0
        return {"y_mean": stats.mean if stats.count else 0.0, "y_std": std if std > 0 else 1.0}

    def n_outputs(self, info: dict) -> int:
        return 1

    def targets(self, labels, info: dict) -> np.ndarray:
        try:
            return labels.to_numpy(dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise DataUnavailableError(f"regression target is not numeric: {exc}") from None

    def train_targets(self, y: np.ndarray, info: dict) -> np.ndarray:
        # Trained on the standardised target (a scale-free loss and lr); export undoes it.
        return ((y - info["y_mean"]) / info["y_std"]).astype(np.float32)

    def export_module(self, model, info: dict):
        from torch import nn

        from training.models import Affine

        return nn.Sequential(model, Affine(info["y_std"], info["y_mean"]))

    def loss(self, out, y, reduction: str = "mean"):
        import torch.nn.functional as F

        return F.mse_loss(out.reshape(-1).float(), y.reshape(-1).float(), reduction=reduction)

    def encode(self, values, info: dict) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).ravel()

    def decode(self, outputs: np.ndarray) -> np.ndarray:
        return np.asarray(outputs, dtype=np.float64)[:, 0]

    def score(self, y: np.ndarray, pred: np.ndarray, info: dict) -> dict:
        from tasks.metrics import regression_metrics

        return regression_metrics(y, pred)

    def baseline(self, cfg, root, info: dict, n: int) -> tuple[str, np.ndarray]:
        """The trivial predictor: the train split's mean, for ``n`` rows."""
        return f"the train mean {info['y_mean']:.4g}", np.full(n, info["y_mean"])

    def _meta(self, info: dict) -> dict:
        return {"output": "value"}

    def _output_type(self, info: dict) -> str:
        return "double"


def _numeric(frame: "pd.DataFrame", columns: list[str]) -> np.ndarray:
    try:
        return frame[columns].to_numpy(dtype=np.float64, na_value=np.nan)
    except (TypeError, ValueError) as exc:
        raise DataUnavailableError(f"feature columns must be numeric: {exc}") from None


def _check_factory(ref: str) -> None:
    """``model.factory``'s module must be importable (found, not imported: that may import torch)."""
    import importlib.util

    module = ref.partition(":")[0]
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(f"model.factory: module {module!r} not found (it must be importable from the "
                          "repository root or an installed package)")


def _file_id(path: Path) -> tuple:
    """A file's identity for the caches: its path, size and modification time (None if missing)."""
    try:
        st = Path(path).stat()
    except OSError:
        return (str(path), None)
    return (str(path), st.st_size, st.st_mtime_ns)
