"""Tabular tasks: classification and regression of a table's named columns (``tasks.table``).

The features' encoding is fitted on the train split (``tasks.encoding``) and baked into the model's
first layer: the exported program takes the encoded row, the registered pyfunc the raw columns by
name. The class set comes from the reviewed expectations file, in the order of the model's outputs;
a regression trains on standardised targets and is exported with the de-scaling inside.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar

import numpy as np

from core.errors import ConfigError, DataUnavailableError
from core.expectations import load_expectations
from core.hashing import file_id
from tasks.base import (PYFUNC_COMMON, Classifier, InitFit, Metric, ModelSpec, Task, ValidationPlan, cache_write,
                        fit_gbdt, init_batch, label_key, load_program, write_program_scores)
from tasks.encoding import FIRST_CODE, MISSING_CODE, OTHER_CODE, column_kinds, encode, numeric_dtype
from tasks.free_text import free_text_reason
from tasks.info import DataInfo
from tasks.table import feature_columns, load_frames, split_paths
from tasks.table_options import leak_policy

if TYPE_CHECKING:
    import pandas as pd

    from core.config import PipelineConfig

# Bump when a metric's definition or computation changes: recorded champion scores then stop matching.
METRICS_VERSION = 3
PYFUNC_FILE = Path(__file__).with_name("pyfunc_table.py")
# What it imports, logged into the model's code/: the shared module and the encoding training used.
PYFUNC_CODE = [PYFUNC_COMMON, Path(__file__).with_name("encoding.py")]
# The gradient-boosted trees beside the candidate fit on at most this many train rows (a seeded sample).
GBDT_MAX_ROWS = 200_000
# An integer feature with this many distinct values at most (and 3 at least) is taken for categories.
MAX_INTEGER_CATEGORIES = 10
# An integer label with at most this many distinct values is taken for classes, not a quantity.
MAX_INFERRED_CLASSES = 20
# Names of identifier columns (lower case), when their values are unique.
ID_NAMES = ("id", "rownames", "row_names", "rowname", "index", "unnamed: 0", "row", "rowid", "row_id", "key",
            "uuid", "guid", "record_id")


def _mlflow_type(dtype, nullable: bool = False) -> str:
    """The MLflow signature type of a column of ``dtype``; a ``nullable`` integer column is ``double``
    (MLflow refuses NaN in a ``long`` column)."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(dtype):
        return "boolean"
    if pd.api.types.is_integer_dtype(dtype):
        return "double" if nullable else "long"
    return "double" if pd.api.types.is_numeric_dtype(dtype) else "string"


INIT_EPOCHS = 30  # the epochs init writes; early stopping usually ends a run sooner


def init_patience(val_rows: float) -> tuple[int, str]:
    """(patience, why) init writes: a small validation split's score moves by chance from epoch to
    epoch, so it waits longer before calling a plateau; the best epoch is kept either way, so a long
    wait costs time, not quality."""
    if val_rows < 500:
        patience, size = 10, "small, its score noisy from epoch to epoch: wait longer"
    elif val_rows < 5000:
        patience, size = 6, "mid-sized"
    else:
        patience, size = 4, "large, its score steady: stop sooner"
    return patience, (f"patience {patience} of {INIT_EPOCHS} epochs; the validation split (~{int(val_rows)} rows) "
                      f"is {size}; the best epoch's weights are kept")


@dataclass(frozen=True)
class TableInfo(DataInfo):
    """A table task's ``info``, fitted on the train split: the features' encodings and MLflow types, and
    the class set (classification) or the target's mean and std (regression)."""

    features: list[str]
    columns: list[dict]
    dtypes: dict[str, str]
    mean: list[float]
    std: list[float]
    classes: list | None = None
    y_mean: float | None = None
    y_std: float | None = None


class _Table(Task):
    """What classification and regression share: reading, features, scaling, the pyfunc."""

    classification: ClassVar[bool] = True
    info_type: ClassVar[type[DataInfo]] = TableInfo
    metrics_version: ClassVar[int] = METRICS_VERSION

    # -- config -----------------------------------------------------------------------------
    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        if cfg.dataset.text is not None:
            raise ConfigError(f"dataset.text: only for the lm task, but task is {self.name!r}")
        if cfg.model.kind == "lm" and cfg.model.factory is None:
            raise ConfigError(f"model.kind: 'lm' is the lm task's model; task {self.name!r} takes tabular, mlp, cnn "
                              "or model.factory")
        if cfg.dataset.expectations_file is None:
            raise ConfigError("dataset.expectations_file: required for a table (`trainflow init` writes one; "
                              "review and commit it)")
        if cfg.model.factory is not None:
            from core.paths import project_root
            from tasks.factory import check_factory

            check_factory(cfg.model.factory, project_root())
        features = cfg.dataset.features
        outside = [c for c in cfg.dataset.categorical if features is not None and c not in features
                   or c in cfg.dataset.exclude]
        if outside:
            raise ConfigError(f"dataset.categorical: {outside[0]!r} is not a feature column (dataset.features / "
                              "dataset.exclude leave it out)")
        if cfg.model.kind == "cnn" and cfg.dataset.categorical:
            raise ConfigError("dataset.categorical: model.kind cnn takes numeric pixels only; use model.kind tabular")

    def _cached(self, key, make):
        """The last value made for each kind of key (``key[0]``): the stages ask for the same frames and
        expectations several times; the key holds the files' identity."""
        cache = self.__dict__.setdefault("_cache", {})
        if cache.get(key[0], (None,))[0] != key:
            cache[key[0]] = (key, make())
        return cache[key[0]][1]

    def expectations(self, cfg: "PipelineConfig", root: Path):
        """The reviewed expectations file, or None when the config names none (a sizing probe)."""
        if cfg.dataset.expectations_file is None:
            return None
        path = Path(root) / cfg.dataset.expectations_file
        return self._cached(("expectations", file_id(path)), lambda: load_expectations(path))

    # -- trainflow init (torch-free) ------------------------------------------------------------
    def _label_facts(self, label: str, labels, ctype: str) -> tuple[str, bool | None]:
        """(why, few) of a label column: ``few``: an integer label has few enough distinct values to
        be classes (None for other types)."""
        n = int(labels.nunique(dropna=True))
        if ctype in ("string", "boolean"):
            return f"label {label!r} is a {ctype} column with {n} distinct values", None
        if ctype == "float":
            return f"label {label!r} holds fractional numbers", None
        few = n <= MAX_INFERRED_CLASSES
        return (f"label {label!r} is an integer column with {n} distinct values"
                + ("" if few else f" (more than {MAX_INFERRED_CLASSES}: a quantity, not classes)")), few

    def init_table(self, cfg: "PipelineConfig", root: Path, where: str, profile: Callable) -> dict:
        """What ``trainflow init`` makes of a table: ``{"frames", "unlabeled", "choices", "dataset"`` (the keys
        its choices add), ``"expectations"``: ``profile(frames, label, class_label, categorical=, dates=)``
        (``validation.profile.profile_table``)}. ValueError: why init refuses it (``where``: its first file)."""
        import pandas as pd

        from tasks.bounds import DataRefusedError, check_class_names, check_classes

        label, presplit = cfg.dataset.label, cfg.dataset.train_file is not None
        # Every row, unlabeled ones too, split as the runs split it: the expectations describe the data
        # validation will check.
        frames = load_frames(cfg.dataset, root, cfg.seed, stratify=self.classification)
        if presplit:
            cols = {s: [str(c) for c in df.columns] for s, df in frames.items()}
            if cols["train"] != cols["test"]:
                only = {s: [c for c in cols[s] if c not in cols[o]] for s, o in (("train", "test"), ("test", "train"))}
                raise ValueError(f"{cfg.dataset.train_file} and {cfg.dataset.test_file} have different columns "
                                 f"(only in train: {only['train']}, only in test: {only['test']}"
                                 f"{'' if any(only.values()) else ', or another order'}); give both the same columns")
        columns = [str(c) for c in next(iter(frames.values())).columns]
        choices = self.init_choices(frames, label, presplit=presplit)
        dataset = {k: sorted(choices[k], key=columns.index) for k in ("exclude", "categorical") if choices[k]}
        if choices["leak_policy"]:
            dataset["leak_policy"] = choices["leak_policy"]
        if choices.get("dates"):
            dataset["dates"] = {c: d["format"] for c, d in choices["dates"].items()}
        class_label = choices["class_label"]
        if class_label:  # more classes than the rows can teach, or a class name longer than a name may be
            values = pd.concat([df[label] for df in frames.values()], ignore_index=True).dropna()
            classes = pd.unique(values.astype(str))
            try:
                check_class_names(classes, label, where)
                check_classes(len(classes), len(values), label, where)
            except DataRefusedError as exc:
                raise ValueError(str(exc)) from None
        expectations = profile(frames, label, class_label, categorical=tuple(dataset.get("categorical", ())),
                               dates=tuple(dataset.get("dates", ())))
        if class_label and len(expectations.classes or []) < 2:
            raise ValueError(f"label {label!r} has a single class {expectations.classes}: nothing to classify")
        return {"frames": frames, "unlabeled": sum(int(df[label].isna().sum()) for df in frames.values()),
                "choices": choices, "dataset": dataset, "expectations": expectations}

    def init_choices(self, frames: dict[str, "pd.DataFrame"], label: str, presplit: bool) -> dict:
        """What ``trainflow init`` decides from the data, with reasons: ``exclude`` (identifiers),
        ``categorical`` (integer columns with few values), ``dates`` (text columns of dates: ``{column:
        {"format", "why"}}``), ``imputed`` / ``missing_category`` (missing counts), ``duplicates``,
        ``leak_policy``, ``training`` (batch, epochs, early stopping), ``patience_why``, ``class_label``."""
        import pandas as pd

        from tasks.encoding import detect_date_format
        from tasks.table import row_hashes

        both = pd.concat([df.rename(columns=str) for df in frames.values()], ignore_index=True)
        exclude, categorical, imputed, missing_category, dates = {}, {}, {}, {}, {}
        for name in [str(c) for c in both.columns]:
            if name == label:
                continue
            s = both[name]
            nulls = int(s.isna().sum())
            numeric = numeric_dtype(s.dtype)
            # Before the identifier check: timestamps are often different in every row.
            fmt, why = (None, "") if numeric else detect_date_format(s)
            if fmt is not None:
                dates[name] = {"format": fmt, "why": why + (f", {nulls} missing" if nulls else "")}
                continue
            why = free_text_reason(s) or _id_like(name, s)
            if why:
                exclude[name] = why
                continue
            values = s.dropna()
            whole = numeric and len(values) > 0 and bool((values == values.round()).all())
            distinct = int(values.nunique())
            if whole and 3 <= distinct <= MAX_INTEGER_CATEGORIES:
                categorical[name] = f"an integer column with {distinct} distinct values: learned as categories"
            if nulls:
                (imputed if numeric and name not in categorical else missing_category)[name] = nulls
        dup = {"within": int(len(both) - len(np.unique(row_hashes(both))))}
        if presplit and {"train", "test"} <= set(frames):
            dup["test_in_train"] = int(np.isin(row_hashes(frames["test"]), row_hashes(frames["train"])).sum())
        batch = init_batch(len(frames.get("train", both)), 32, 1024)
        patience, patience_why = init_patience(len(frames.get("train", both)) * 0.1)  # val_fraction's default
        return {"exclude": exclude, "categorical": categorical, "dates": dates, "imputed": imputed,
                "missing_category": missing_category, "duplicates": dup,
                "leak_policy": "warn" if dup.get("test_in_train") else None,
                "training": {"epochs": INIT_EPOCHS, "batch_size": batch, "base_batch": batch,
                             "early_stopping": {"patience": patience}},
                "patience_why": patience_why, "class_label": self.classification,
                **(_metric_choice(both[label].dropna()) if self.classification and label in both else {})}

    # -- validation ---------------------------------------------------------------------------
    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        exp = self.expectations(cfg, root)
        files = [*split_paths(cfg.dataset, root).values(), Path(root) / cfg.dataset.expectations_file]
        return ValidationPlan("validation.suite", files, {
            "dataset": cfg.dataset, "root": Path(root), "seed": cfg.seed, "stratify": self.classification,
            "expectations": exp, "features": feature_columns(cfg.dataset, exp.names), "label": cfg.dataset.label,
            "class_label": self.classification, "leak_policy": leak_policy(cfg.dataset),
            "dates": dict(cfg.dataset.dates)})

    def data_splits(self, cfg: "PipelineConfig") -> dict[str, tuple[str, str]]:
        files = cfg.dataset.split_files  # one ``all`` file is split by seed into both
        base = cfg.dataset.path.rstrip("/")
        return {"train": (f"{base}/{files.get('train', files.get('all'))}", "training"),
                "test": (f"{base}/{files.get('test', files.get('all'))}", "testing")}

    # -- data ---------------------------------------------------------------------------------
    def frames(self, cfg: "PipelineConfig", root: Path) -> dict[str, "pd.DataFrame"]:
        """``{"train", "test"}`` frames without unlabeled rows (shared: callers must not modify them)."""
        key = ("frames", tuple(file_id(p) for p in split_paths(cfg.dataset, root).values()),
               cfg.dataset.model_dump_json(), cfg.seed, self.classification)
        return self._cached(key, lambda: load_frames(cfg.dataset, root, cfg.seed, stratify=self.classification,
                                                     labeled_only=True))

    def kinds(self, cfg: "PipelineConfig", root: Path, features: list[str], frame=None) -> dict[str, str]:
        """``{feature: "numeric" | "categorical"}`` by the expectations file's types and
        ``dataset.categorical``; without an expectations file (a sizing probe), by ``frame``'s dtypes."""
        missing = [c for c in cfg.dataset.categorical if c not in features]
        if missing:
            raise ConfigError(f"dataset.categorical: {missing[0]!r} is not a feature column; the features are "
                              f"{features[:10]}")
        missing = [c for c in cfg.dataset.dates if c not in features]
        if missing:
            raise ConfigError(f"dataset.dates.{missing[0]}: not a feature column; the features are {features[:10]}")
        exp = self.expectations(cfg, root)
        if exp is not None:
            types = {c.name: c.type for c in exp.columns}
        elif frame is not None:
            types = {f: "float" if numeric_dtype(frame[f].dtype) else "string" for f in features}
        else:
            types = {}
        return column_kinds(features, types, cfg.dataset.categorical, cfg.dataset.dates)

    def _features(self, cfg: "PipelineConfig", names) -> list[str]:
        """The feature columns among the train split's ``names``; DataUnavailableError when it lacks one."""
        features = feature_columns(cfg.dataset, [str(c) for c in names])
        missing = [c for c in [*features, cfg.dataset.label] if c not in names]
        if missing:
            raise DataUnavailableError(f"train split lacks column(s) {missing}; found {list(names)}")
        return features

    def info(self, cfg: "PipelineConfig", root: Path, frames: dict | None = None) -> TableInfo:
        """What the model and the registry need to know of the data, fitted on the train split."""
        if frames is None:
            return self.prepared(cfg, root)["info"]
        from tasks.encoding import fit_columns

        train = frames["train"]
        features = self._features(cfg, train.columns)
        try:
            columns = fit_columns([train[features]], self.kinds(cfg, root, features, train),
                                  cfg.dataset.max_categories, cfg.seed, cfg.dataset.dates, cfg.dataset.date_parts)
        except ValueError as exc:
            raise DataUnavailableError(str(exc)) from None
        return TableInfo(**self._info(cfg, root, features, columns, {c: train[c].dtype for c in features}),
                         **self._target_info(cfg, root, train[cfg.dataset.label]))

    def _info(self, cfg, root, features: list[str], columns: list[dict], dtypes: dict) -> dict:
        """The feature part of ``info`` from the fitted columns and the columns' pandas dtypes."""
        exp = self.expectations(cfg, root)
        nullable = {c.name for c in exp.columns if c.nulls} if exp is not None else set()
        # A date's parts are typed by their column: its text, nullable where the expectations allow it.
        types = {c["name"]: _mlflow_type(dtypes[c["name"]], nullable=c["name"] in nullable or c["nulls"] > 0)
                 for c in columns if "source" not in c}
        types.update({c["source"]: _mlflow_type(dtypes[c["source"]], nullable=c["source"] in nullable)
                      for c in columns if "source" in c})
        return {"features": features, "columns": columns, "dtypes": types,
                "mean": [c["mean"] if c["kind"] == "numeric" else 0.0 for c in columns],
                "std": [c["std"] if c["kind"] == "numeric" else 1.0 for c in columns]}

    def loader_kind(self, cfg: "PipelineConfig", root: Path) -> tuple[str, str]:
        from tasks.table_stream import choose_loader

        return choose_loader(cfg, root)

    def table_stream(self, cfg: "PipelineConfig", root: Path, data_md5: str):
        from tasks.table_stream import TableStream

        return TableStream.of(self, cfg, root, data_md5)

    def stream_info(self, cfg: "PipelineConfig", root: Path, source: Path, names: tuple, types: dict) -> TableInfo:
        """``info`` of a train split too large to load, fitted batch by batch over ``source`` (Parquet;
        ``names`` / ``types``: its columns and pyarrow types)."""
        import pandas as pd

        from tasks.columnar import ColumnStats, iter_batches
        from tasks.encoding import TableFit

        features, label = self._features(cfg, names), cfg.dataset.label
        dtypes = {c: types[c].to_pandas_dtype() for c in features}
        empty = pd.DataFrame({c: pd.Series(dtype=dtypes[c]) for c in features})  # the kinds by dtype, no rows
        fit = TableFit(self.kinds(cfg, root, features, empty), cfg.dataset.max_categories, cfg.seed,
                       cfg.dataset.dates, cfg.dataset.date_parts)
        target = ColumnStats(label, values={} if self.classification else None)
        for batch in iter_batches(source, [*features, label]):
            try:
                fit.update(batch.select(features).to_pandas())
            except ValueError as exc:
                raise DataUnavailableError(f"{source}: {exc}") from None
            target.update(batch.column(batch.schema.names.index(label)))
        return TableInfo(**self._info(cfg, root, features, fit.columns(), dtypes),
                         **self._stream_target_info(cfg, root, target))

    def target_dtype(self):
        return np.int64 if self.classification else np.float32

    def features_of(self, frame: "pd.DataFrame", info: TableInfo) -> np.ndarray:
        """The encoded feature columns of ``frame`` (``tasks.encoding.encode``), float32 [n, f]."""
        try:
            return encode(frame, info.columns)
        except ValueError as exc:
            raise DataUnavailableError(str(exc)) from None

    def prepared(self, cfg: "PipelineConfig", root: Path) -> dict:
        """``{"x", "y", "xt", "yt", "info"}``: both splits encoded (targets not yet standardised), cached in
        ``TRAINFLOW_HOME/cache/tables`` as ``.npz`` + JSON (no pickle): ranks then skip pandas."""
        from core.paths import trainflow_home

        key = self.prepared_key(cfg, root)
        folder = trainflow_home(Path(root)) / "cache" / "tables"
        npz, meta = folder / f"{key[:32]}.npz", folder / f"{key[:32]}.json"
        try:
            with np.load(npz, allow_pickle=False) as arrays:
                out = {k: arrays[k] for k in ("x", "y", "xt", "yt")}
            return {**out, "info": self.info_type.from_json(json.loads(meta.read_text()))}
        except (OSError, ValueError, KeyError, TypeError):  # TypeError: an info with other fields
            pass
        frames = self.frames(cfg, root)
        info = self.info(cfg, root, frames)
        # A missing value stays NaN: the model's first layer imputes it, in training and in the export.
        (x, y), (xt, yt) = [(self.features_of(f, info), self.targets(f[cfg.dataset.label], info))
                            for f in (frames["train"], frames["test"])]
        cache_write(meta, lambda fh: fh.write(json.dumps(info.to_json()).encode()))  # the info first:
        cache_write(npz, lambda fh: np.savez(fh, x=x, y=y, xt=xt, yt=yt))  # an .npz is only read beside it
        return {"x": x, "y": y, "xt": xt, "yt": yt, "info": info}

    def prepared_key(self, cfg: "PipelineConfig", root: Path) -> str:
        """What ``prepared``'s arrays are a function of (sha256 hex): the files' bytes, the config's
        dataset, the seed and this code."""
        import inspect

        from core.hashing import file_sha256, sha256_json

        files = [*split_paths(cfg.dataset, root).values()]
        if cfg.dataset.expectations_file:
            files.append(Path(root) / cfg.dataset.expectations_file)
        code = {Path(__file__), Path(inspect.getfile(type(self))), Path(__file__).with_name("table.py"),
                Path(__file__).with_name("encoding.py")}
        return self._cached(("prepared_key", tuple(file_id(f) for f in files), cfg.dataset.model_dump_json(),
                             cfg.seed), lambda: sha256_json({
            "task": self.name, "seed": cfg.seed, "dataset": cfg.dataset.model_dump(mode="json"),
            "files": [file_sha256(f) if f.is_file() else str(f) for f in files],
            "code": sorted(file_sha256(p) for p in code)}))

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        from tasks.splits import Splits, tensors

        p = self.prepared(cfg, root)
        x, y, info = p["x"], p["y"], p["info"]
        keep, hold = self.holdout(y, cfg, seed)
        y, yt = self.train_targets(y, info), self.train_targets(p["yt"], info)
        return Splits(train=tensors(x[keep], y[keep]), val=tensors(x[hold], y[hold]), test=tensors(p["xt"], yt),
                      info=info)

    def holdout(self, y: np.ndarray, cfg: "PipelineConfig", seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Train-split row indices ``(keep, held out for per-epoch validation)``: a seeded
        ``val_fraction``, stratified by class for a classifier."""
        from tasks.splits import stratified_holdout

        groups = y if self.classification else np.zeros(len(y), dtype=np.int64)
        return stratified_holdout(groups, cfg.dataset.val_fraction, seed)

    def train_targets(self, y: np.ndarray, info: TableInfo) -> np.ndarray:
        return y

    # -- model --------------------------------------------------------------------------------
    def build_model(self, cfg: "PipelineConfig", info: TableInfo):
        from tasks.table_nets import table_network

        return table_network(cfg.model, info.columns, self.n_outputs(info))

    def example_input(self, cfg: "PipelineConfig", info: TableInfo, batch: int = 2):
        """A batch of typical rows: each numeric column's train median, each category's first value."""
        import torch

        row = [c["median"] if c["kind"] == "numeric" else (FIRST_CODE if c["values"] else OTHER_CODE)
               for c in info.columns]
        return torch.tensor([row] * batch, dtype=torch.float32)

    # -- evaluation hooks (the "predictions" evaluator) ----------------------------------------
    def eval_data(self, cfg: "PipelineConfig", root: Path) -> tuple["pd.DataFrame", np.ndarray, np.ndarray, dict]:
        """(test frame, features float32, targets, info) of the evaluation split; the targets only go to
        ``score``, so a task may pack in what its metrics need besides the truth."""
        p = self.prepared(cfg, root)
        return self.frames(cfg, root)["test"], p["xt"], p["yt"], p["info"]

    def write_test_scores(self, cfg: "PipelineConfig", root: Path, out: Path) -> None:
        val = self.validation_split(cfg, root)
        write_program_scores(out, self.prepared(cfg, root)["xt"], self.decode,
                             self.scoring_key(cfg, root)["split_sha256"], None if val is None else val[0])

    def validation_split(self, cfg: "PipelineConfig", root: Path) -> tuple | None:
        """A classifier's held-out train rows (``holdout`` with the config's seed, as in-memory training
        validates on); None for a regression (nothing to tune)."""
        if not self.classification:
            return None
        p = self.prepared(cfg, root)
        _, hold = self.holdout(p["y"], cfg, cfg.seed)
        return p["x"][hold], p["y"][hold]

    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        from core.hashing import file_sha256, sha256_json

        files = {k: file_sha256(p) for k, p in sorted(split_paths(cfg.dataset, root).items())}
        # The test split's identity: its file, or the one file with the seed and fraction that split it.
        split = sha256_json({"files": files, **({"seed": cfg.seed, "test_fraction": cfg.dataset.test_fraction}
                                                 if "all" in files else {})})
        parts = {"task": self.name, "split_sha256": split, "metrics_version": self.metrics_version,
                 "label": cfg.dataset.label}
        if self.classification:
            parts["classes"] = [label_key(c) for c in self.prepared(cfg, root)["info"].classes]
        return {"key": sha256_json(parts), "split_sha256": split, "metrics_version": self.metrics_version}

    def gbdt(self, cfg: "PipelineConfig", root: Path) -> dict | None:
        """scikit-learn's HistGradientBoosting (default settings) on the network's encoded columns."""
        def arrays():
            from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

            p = self.prepared(cfg, root)
            cats = np.array([c["kind"] == "categorical" for c in p["info"].columns], dtype=bool)
            est = (HistGradientBoostingClassifier if self.classification else HistGradientBoostingRegressor)(
                categorical_features=cats if cats.any() else None, random_state=cfg.seed)
            return est, p["x"], p["y"], p["xt"], lambda a: _gbdt_matrix(a, cats)

        return fit_gbdt(root, {"prepared": self.prepared_key(cfg, root)}, arrays, cfg.seed, GBDT_MAX_ROWS, "rows")

    def drift_frames(self, cfg: "PipelineConfig", root: Path, reference, read) -> tuple:
        """The training file (or the one file both splits come from), then and now, and the features
        (date columns left out)."""
        import io

        import pandas as pd

        from tasks.table import FORMATS, read_table

        train_path = Path(reference.path) / (reference.split_files.get("train") or reference.split_files["all"])
        raw = read(train_path)
        parquet = FORMATS.get(train_path.suffix.lower()) == "parquet"
        then = pd.read_parquet(io.BytesIO(raw)) if parquet else pd.read_csv(io.BytesIO(raw))
        now = read_table(Path(root) / cfg.dataset.path / (cfg.dataset.split_files.get("train")
                                                          or cfg.dataset.split_files["all"]))
        # Not the date columns: a later data version brings later dates by nature.
        return then, now, [c for c in feature_columns(cfg.dataset, [str(c) for c in now.columns])
                           if c not in cfg.dataset.dates]

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        """The predictor gets the evaluation split's feature columns, as a serving client sends them."""
        frame, _, y, info = self.eval_data(cfg, root)
        return self.score(y, self.encode(predictor(frame[info.features]), info), info)

    # -- registry -------------------------------------------------------------------------------
    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        frame, _, _, info = self.eval_data(cfg, root)
        example = frame[info.features].head(5).reset_index(drop=True)
        output, output_type = self._output(info)
        meta = {"format": "torch.export", "input_dtype": "float32", "feature_columns": info.features,
                "columns": [{"name": c["name"], "kind": c["kind"], **({"values": c["values"]}
                                                                      if c["kind"] == "categorical" else {}),
                             **{k: c[k] for k in ("source", "part", "format") if k in c}}
                            for c in info.columns],
                "codes": {"missing": MISSING_CODE, "other": OTHER_CODE, "first": FIRST_CODE}, **output,
                **({"threshold": report["candidate"]["threshold"]}
                   if report.get("candidate", {}).get("threshold") is not None else {})}
        # The data's other columns (an excluded id), not the label: a client sending the table's rows
        # as they are gets no warning for them.
        unused = [c for c in frame.columns if c not in info.features and c != cfg.dataset.label]
        return ModelSpec(PYFUNC_FILE, meta, [(c, info.dtypes[c]) for c in info.features],
                         [(None, output_type)], example,
                         checked=report.get("candidate_scored_in") == "worker",
                         optional_inputs=[str(c) for c in unused], params=list(self.predict_params),
                         code_paths=list(PYFUNC_CODE))

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        import torch

        program = load_program(model_pt2)
        missing = [c for c in spec.meta["feature_columns"] if c not in spec.example.columns]
        if missing:
            raise ValueError(f"the input example lacks feature columns {missing[:5]}")
        columns = spec.meta.get("columns") or [{"name": c, "kind": "numeric"} for c in spec.meta["feature_columns"]]
        x = torch.tensor(encode(spec.example.head(5), columns))
        with torch.inference_mode():
            out = program(x).numpy()
        n = len(spec.meta.get("class_labels") or [None])
        if out.ndim != 2 or out.shape != (len(x), n):
            raise ValueError(f"{model_pt2}: maps [{len(x)}, {x.shape[1]}] inputs to {list(out.shape)}, "
                             f"expected [{len(x)}, {n}]")

    def check_program_output(self, out: np.ndarray, info: TableInfo) -> None:
        """Raise ValueError when a program's output on a batch does not fit this task."""
        want = self.n_outputs(info)
        if out.ndim != 2 or out.shape[1] != want:
            raise ValueError(f"the program gives outputs of shape {list(out.shape)}, expected [rows, {want}]")


class Classification(Classifier, _Table):
    name = "classification"

    def init_fit(self, label: str, labels, ctype: str) -> InitFit:
        why, few = self._label_facts(label, labels, ctype)
        if ctype == "float":
            return InitFit(False, False, f"{why}, not classes; use --task regression "
                                         "(or round them to the classes they stand for)")
        return InitFit(True, few is not False, why)

    def init_defaults(self) -> dict:
        return {"model": {"kind": "tabular", "hidden": 256, "layers": 3, "dropout": 0.1},
                "gates": {"baseline_margin": 0.05, "thresholds": {"latency_p95_ms": 50}}}

    def _target_info(self, cfg, root, labels) -> dict:
        exp = self.expectations(cfg, root)
        classes = exp.classes if exp is not None else None
        if classes is None:  # no reviewed class set: the train split's, sorted
            classes = sorted(set(labels.dropna().tolist()), key=label_key)
        if len(classes) < 2:
            raise ConfigError(f"{cfg.dataset.expectations_file}: the label {cfg.dataset.label!r} needs at least "
                              f"two classes, got {classes}")
        return {"classes": [c.item() if hasattr(c, "item") else c for c in classes]}

    def _stream_target_info(self, cfg, root, stats) -> dict:
        import pandas as pd

        return self._target_info(cfg, root, pd.Series(sorted(stats.values or {}, key=label_key)))

    def n_outputs(self, info: TableInfo) -> int:
        return len(info.classes)

    def targets(self, labels, info: TableInfo) -> np.ndarray:
        _no_missing_labels(labels)
        index = {label_key(c): i for i, c in enumerate(info.classes)}
        keys = [label_key(v) for v in labels.tolist()]
        bad = sorted({k for k in keys if k not in index})
        if bad:
            raise DataUnavailableError(f"label values {bad[:5]} are outside the recorded class set "
                                       f"{info.classes}")
        return np.asarray([index[k] for k in keys], dtype=np.int64)

    def baseline(self, cfg, root, info: TableInfo, n: int) -> tuple[str, np.ndarray]:
        return self.majority(self.targets(self.frames(cfg, root)["train"][cfg.dataset.label], info), info, n)

    def _output(self, info: TableInfo) -> tuple[dict, str]:
        output_type = "string" if any(isinstance(c, str) for c in info.classes) else "long"
        return {"output": "label", "class_labels": info.classes}, output_type

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        """The champion's labels as it serves them, and its class probabilities where it gives them
        (``predict_method: predict_proba``; a model without them is scored as a hard classifier)."""
        frame, _, y, info = self.eval_data(cfg, root)
        labels = self.encode(predictor(frame[info.features]), info)
        proba_of = getattr(predictor, "proba", None)
        proba = None if proba_of is None else self.encode_proba(proba_of(frame[info.features]), info)
        return self.score(y, labels, info) if proba is None else self.score(y, proba, info, labels=labels)


class Regression(_Table):
    name = "regression"
    classification = False
    metrics = (Metric("r2", True), Metric("rmse", False), Metric("mae", False), Metric("latency_p95_ms", False))
    champion_metrics = ("r2", "rmse")
    primary = "r2"

    def val_accuracy(self, correct: float, n: int) -> None:
        return None

    def init_fit(self, label: str, labels, ctype: str) -> InitFit:
        why, few = self._label_facts(label, labels, ctype)
        if ctype in ("string", "boolean"):
            return InitFit(False, False, f"{why}; regression needs a numeric label")
        return InitFit(True, ctype == "float" or few is False, why)

    def init_defaults(self) -> dict:
        return {"model": {"kind": "tabular", "hidden": 256, "layers": 3, "dropout": 0.0},
                "gates": {"baseline_margin": 0.1, "thresholds": {"latency_p95_ms": 50}}}

    def _target_info(self, cfg, root, labels) -> dict:
        y = labels.to_numpy(dtype=np.float64, na_value=np.nan)
        y = y[np.isfinite(y)]
        std = float(y.std()) if len(y) else 1.0
        return {"y_mean": float(y.mean()) if len(y) else 0.0, "y_std": std if std > 0 else 1.0}

    def _stream_target_info(self, cfg, root, stats) -> dict:
        std = stats.std if stats.count else 1.0
        return {"y_mean": stats.mean if stats.count else 0.0, "y_std": std if std > 0 else 1.0}

    def n_outputs(self, info: TableInfo) -> int:
        return 1

    def targets(self, labels, info: TableInfo) -> np.ndarray:
        _no_missing_labels(labels)
        try:
            return labels.to_numpy(dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise DataUnavailableError(f"regression target is not numeric: {exc}") from None

    def train_targets(self, y: np.ndarray, info: TableInfo) -> np.ndarray:
        # Trained on the standardised target (a scale-free loss and lr); export undoes it.
        return ((y - info.y_mean) / info.y_std).astype(np.float32)

    def export_module(self, model, info: TableInfo):
        from torch import nn

        from tasks.table_nets import Affine

        return nn.Sequential(model, Affine(info.y_std, info.y_mean))

    def loss(self, out, y, reduction: str = "mean"):
        import torch.nn.functional as F

        return F.mse_loss(out.reshape(-1).float(), y.reshape(-1).float(), reduction=reduction)

    def encode(self, values, info: TableInfo) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).ravel()

    def decode(self, outputs: np.ndarray) -> np.ndarray:
        return np.asarray(outputs, dtype=np.float64)[:, 0]

    def score(self, y: np.ndarray, pred: np.ndarray, info: TableInfo) -> dict:
        from tasks.metrics import regression_metrics

        return regression_metrics(y, pred)

    def baseline(self, cfg, root, info: TableInfo, n: int) -> tuple[str, np.ndarray]:
        """The trivial predictor: the train split's mean, for ``n`` rows."""
        return f"the train mean {info.y_mean:.4g}", np.full(n, info.y_mean)

    def _output(self, info: TableInfo) -> tuple[dict, str]:
        return {"output": "value"}, "double"


# A class set is imbalanced when its rarest class has less than this share of an even split (1/k):
# under 20 % for two classes, under 8 % for five.
IMBALANCED_SHARE = 0.4


def _metric_choice(labels: "pd.Series") -> dict:
    """``trainflow init``'s metric for a label column: accuracy for balanced classes; when the rarest class
    is under ``IMBALANCED_SHARE`` of an even split, a ranking metric (two classes: average precision, the
    rare class's precision-recall AUC; more: ROC AUC one-vs-rest) and class-balanced loss weights.
    ``{"metric": (primary_metric or None, why), "class_weight": (value, why) | None}``."""
    shares = labels.map(label_key).value_counts(normalize=True)
    if len(shares) < 2:
        return {}
    rare, share, k = shares.index[-1], float(shares.iloc[-1]), len(shares)
    if share >= IMBALANCED_SHARE / k:
        return {"metric": (None, f"accuracy: the classes are balanced enough (the rarest, {rare!r}, is "
                                 f"{share:.1%} of the rows)"), "class_weight": None}
    metric = "average_precision" if k == 2 else "roc_auc"
    what = ("the precision-recall AUC of the rare class" if k == 2 else "how well each class is ranked above the rest")
    return {"metric": (metric, f"{metric}: the rarest class {rare!r} is {share:.1%} of the rows, so predicting "
                               f"{shares.index[0]!r} everywhere scores {float(shares.iloc[0]):.1%} accuracy; "
                               f"{metric} measures {what}, and a constant predictor gets no credit"),
            "class_weight": ("balanced", f"balanced: {rare!r} weighs {float(shares.iloc[0]) / share:.0f}x a "
                                         f"{shares.index[0]!r} row in the loss, so the network does not settle "
                                         "on the majority")}


def _id_like(name: str, s: "pd.Series") -> str | None:
    """Why a unique, complete column is an identifier (a running number, a different text in every row,
    or named like one), or None."""
    import pandas as pd

    n = len(s)
    if n < 10 or s.isna().any() or s.nunique() != n:
        return None
    if numeric_dtype(s.dtype):
        v = s.to_numpy(dtype=np.float64)
        if (v == np.round(v)).all() and v.max() - v.min() == n - 1:
            return f"a running number {int(v.min())}..{int(v.max())}, one per row: a row id, not a feature"
    elif not pd.api.types.is_bool_dtype(s.dtype):
        return "a different text in every row: an identifier (or free text), not a category"
    if name.strip().lower() in ID_NAMES or name.lower().endswith("_id"):
        return "named like an id and unique in every row"
    return None


def _no_missing_labels(labels) -> None:
    """DataUnavailableError when labels are missing (the streamed loader reads the files as they are)."""
    missing = int(labels.isna().sum())
    if missing:
        raise DataUnavailableError(f"{missing} row(s) have no label: a streamed train split must be labeled in "
                                   "every row (drop those rows from its files, or load it in memory)")


def _gbdt_matrix(x: np.ndarray, categorical: np.ndarray) -> np.ndarray:
    """Encoded columns as HistGradientBoosting takes them: float64, a category's code shifted to
    0 = other, 1.. = the vocabulary (at most 254 kept; later ones become other), missing as NaN."""
    out = x.astype(np.float64)
    if categorical.any():
        codes = out[:, categorical]
        codes = np.where(codes == MISSING_CODE, np.nan, codes - OTHER_CODE)
        codes[codes > 254] = 0
        out[:, categorical] = codes
    return out
