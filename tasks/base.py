"""The task API: the one place that knows a kind of problem; the rooms ask it.

| the task answers | asked by |
|---|---|
| ``check_config``: the keys that must hold for this kind (ConfigError naming them) | ``flows`` at load |
| ``validation_plan``: what to validate and the suite module that runs it, torch-free | ``validation`` |
| ``data_splits``: the data's splits by name, each a file and an MLflow context | ``flows`` (MLflow datasets) |
| ``load_data`` / ``loader_kind`` / ``table_stream`` / ``build_model`` / ``example_input`` / ``loss`` | ``training`` |
| ``val_correct`` / ``val_accuracy`` / ``val_scores`` / ``export_module`` | ``training`` |
| ``parallel_plan``: how its model splits for tensor / pipeline parallelism, if it does | ``training.parallel`` |
| ``metrics`` (each with a direction), ``evaluator`` or the per-row hooks, ``scoring_key``, ``gbdt`` | ``evaluation`` |
| ``model_spec``: the pyfunc file, its metadata, signature and input example; ``loaded_model`` | ``registry`` |
| ``init_fit`` / ``init_defaults`` / ``init_table`` / ``init_reads`` / ``init_folder``: what init writes | ``flows.init`` |

Rooms outside ``tasks/`` use only what ``Task`` declares (``tests/unit/test_boundaries.py``).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from core.errors import ConfigError
from tasks.info import DataInfo

if TYPE_CHECKING:
    from core.config import PipelineConfig

# torch.export.load asserts on a process-wide global ("_CURRENT_DESERIALIZER is already set") and
# MLflow's models-from-code loader hands models back through another: every load of a program or
# a logged model in this process (the registry's too) takes this lock.
PROGRAM_LOCK = threading.RLock()
# Rank 0's scores of the exported program on the evaluation split (``Task.write_test_scores``).
SCORES_FILE = "test_scores.json"


def load_program(path: Path):
    """The callable module of a saved ``torch.export`` program; ValueError when it is not one."""
    import torch

    try:
        with PROGRAM_LOCK:
            return torch.export.load(str(path)).module()
    except Exception as exc:
        raise ValueError(f"{path}: not a loadable torch.export program: {exc}") from exc


# Rows the program scores at a time: a split's inputs (a memory map read as float) never all in memory.
PROGRAM_ROWS = 1024


def program_outputs(program, x) -> "np.ndarray":
    """``program``'s outputs on the rows of ``x`` (an array, a tensor, or rows read a slice at a time),
    ``PROGRAM_ROWS`` at a time."""
    import numpy as np
    import torch

    with torch.no_grad():
        return np.concatenate([program(torch.as_tensor(np.asarray(x[i:i + PROGRAM_ROWS]))).numpy()
                               for i in range(0, max(len(x), 1), PROGRAM_ROWS)])


def write_program_scores(out: Path, x, decode: Callable, split_sha256: str, val_x=None) -> None:
    """Rank 0, after export: ``out/model.pt2``'s ``decode``d predictions on ``x`` (and on the held-out
    train rows ``val_x``, where a decision threshold is tuned), one-row latencies and the hashes of the
    program and the split into ``test_scores.json`` (read back while both hold)."""
    import json

    import torch

    from core.hashing import file_sha256
    from tasks.metrics import timings_ms

    program = load_program(Path(out) / "model.pt2")
    outputs = program_outputs(program, x)
    with torch.no_grad():
        times = timings_ms(lambda row: program(torch.as_tensor(row)).numpy(), x)
    scores = {"pred": decode(outputs).tolist(), "outputs_shape": list(outputs.shape), "latency_ms": times,
              "threads": torch.get_num_threads(), "model_sha256": file_sha256(Path(out) / "model.pt2"),
              "split_sha256": split_sha256}
    if val_x is not None:
        scores["val_pred"] = decode(program_outputs(program, val_x)).tolist()
    tmp = Path(out) / (SCORES_FILE + ".tmp")
    tmp.write_text(json.dumps(scores))
    tmp.replace(Path(out) / SCORES_FILE)


def champion_scores(recorded: dict | None, champion, rescore: Callable) -> tuple[dict | None, str | None]:
    """An evaluator's ``(champion's scores, how they were had)``: ``recorded`` when given, else the loaded
    ``champion`` rescored (``rescore(champion)``); ``(None, None)`` without a champion."""
    if recorded is not None:
        return recorded, "recorded"
    return (None, None) if champion is None else (rescore(champion), "rescored")


def cache_write(path: Path, write: Callable) -> None:
    """``write(binary file)`` into ``path`` through a temporary name, so a reader sees all of it or
    nothing; an unwritable cache (a read-only home) is left alone: the value is made again next time."""
    import os

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    except OSError:
        pass


def init_batch(train_rows: int, smallest: int, largest: int) -> int:
    """``trainflow init``'s batch size: the power of two in ``[smallest, largest]`` that makes an
    epoch of ``train_rows`` about 40 optimizer steps on 2 workers."""
    return int(min(largest, max(smallest, 2 ** math.ceil(math.log2(max(train_rows, 1) / 80)))))


# The trees' baseline's budget. Multiclass gradient boosting grows one tree per class per iteration,
# holds the raw predictions, gradients and hessians of every row for every class, and keeps every
# tree: a label with thousands of classes costs tens of GB. Beyond either bound the baseline is
# skipped (``gbdt_budget``), saying why; the network is still trained, scored and gated.
GBDT_MAX_BYTES = 1 << 30  # estimated peak memory of one fit
GBDT_MAX_WORK = 2e10  # rows x features x trees (iterations x trees per iteration): the fit's time
GBDT_TREE_BYTES = 8 << 10  # one fitted tree (31 leaves: 61 nodes) and its Python objects


def gbdt_budget(rows: int, features: int, classes: int, iterations: int) -> str | None:
    """Why the trees' baseline cannot fit the budget for this data (None: it fits). ``classes``: 0 or
    1 for a regression, 2 for binary classification (one tree per iteration), K > 2 for K trees."""
    per_iteration = classes if classes > 2 else 1
    trees = iterations * per_iteration
    memory = rows * features + 3 * 8 * rows * per_iteration + trees * GBDT_TREE_BYTES
    work = float(rows) * features * trees
    shape = f"{rows:,} rows x {features:,} features x {per_iteration:,} tree(s) per iteration x {iterations} iterations"
    if memory > GBDT_MAX_BYTES:
        return (f"the gradient-boosted trees' baseline is skipped: {shape} needs about {memory / 2**30:.1f} GiB, "
                f"over its budget of {GBDT_MAX_BYTES / 2**30:.0f} GiB")
    if work > GBDT_MAX_WORK:
        return (f"the gradient-boosted trees' baseline is skipped: {shape} is {work:.1e} units of work, over its "
                f"budget of {GBDT_MAX_WORK:.0e}")
    return None


def fit_gbdt(root: Path, key: dict, arrays: Callable, seed: int, max_rows: int, what: str,
             describe: Callable | None = None) -> dict:
    """scikit-learn's gradient-boosted trees beside a task's network (``Task.gbdt``), cached as JSON
    in ``TRAINFLOW_HOME/cache/gbdt`` by ``key`` and scikit-learn's version (``fit_s`` is the first
    fit's). ``arrays()`` gives ``(estimator, x, y, xt, matrix)``, ``matrix`` turning x or xt into
    the estimator's input; at most ``max_rows`` of x (a seeded sample) are fitted, on one thread.
    Returns ``{"predictor", "pred", "fit_s", "predict_s", "cached"}`` and a classifier's ``proba``
    ([n, k], column j the probability of class index j), or ``{"skipped": why}`` when the fit would
    break its budget (``gbdt_budget``). ``describe(estimator) -> (name, settings)``: another model
    than the trees (e.g. ``fit_tfidf``'s), which has no trees' budget."""
    import json
    import time
    from importlib.metadata import version

    import numpy as np

    from core.hashing import sha256_json
    from core.paths import trainflow_home

    digest = sha256_json({**key, "sklearn": version("scikit-learn"), "max_rows": max_rows, "v": 2})[:32]
    path = trainflow_home(Path(root)) / "cache" / "gbdt" / f"{digest}.json"
    try:
        cached = json.loads(path.read_text())
        return {**cached, "pred": np.asarray(cached["pred"]), "cached": True,
                **({"proba": np.asarray(cached["proba"])} if "proba" in cached else {})}
    except (OSError, ValueError, KeyError):
        pass
    import sklearn
    from threadpoolctl import threadpool_limits  # scikit-learn's own dependency

    est, x, y, xt, matrix = arrays()
    sampled = len(x) > max_rows
    if sampled:
        rows = np.sort(np.random.default_rng(seed).choice(len(x), max_rows, replace=False))
        x, y = x[rows], y[rows]
    x, xt = matrix(x), matrix(xt)
    classes = len(np.unique(y)) if hasattr(est, "classes_") or hasattr(est, "predict_proba") else 1
    if describe is None and (why := gbdt_budget(x.shape[0], x.shape[1], classes,
                                                int(est.get_params().get("max_iter", 100)))):
        return {"skipped": why}
    with threadpool_limits(1):
        t0 = time.perf_counter()
        est.fit(x, y)
        t1 = time.perf_counter()
        pred = est.predict(xt)
        t2 = time.perf_counter()
        proba = None
        if hasattr(est, "predict_proba"):
            part = est.predict_proba(xt)
            proba = np.zeros((len(xt), int(est.classes_.max()) + 1))
            proba[:, est.classes_.astype(np.int64)] = part
    name, settings = (describe(est) if describe is not None
                      else (type(est).__name__, f"default settings, {est.n_iter_} iterations"))
    out = {"predictor": f"{name} (scikit-learn {sklearn.__version__}, {settings}, 1 thread"
                        + (f", fitted on {max_rows:,} sampled train {what}" if sampled else "")
                        + (f", on the {x.shape[1]} resized pixels" if what == "images" else "") + ")",
           "pred": pred.tolist(), "fit_s": round(t1 - t0, 3), "predict_s": round(t2 - t1, 3)}
    if proba is not None:
        out["proba"] = proba.tolist()
    cache_write(path, lambda fh: fh.write(json.dumps(out).encode()))
    return {**out, "pred": pred, "cached": False, **({"proba": proba} if proba is not None else {})}


def label_key(value) -> str:
    """Labels compare as text: 3 in a CSV and 3 in the YAML class set are the same class."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


@dataclass(frozen=True)
class Metric:
    """One figure the evaluation reports. ``relative``: the champion regression allowance
    (``gates.max_regression``) is a factor of the champion's value rather than an amount."""

    name: str
    higher_is_better: bool
    relative: bool = False

    @property
    def op(self) -> str:
        return ">=" if self.higher_is_better else "<="


# The module every built-in pyfunc file imports (``tasks/pyfunc_common.py``).
PYFUNC_COMMON = Path(__file__).with_name("pyfunc_common.py")


@dataclass
class ModelSpec:
    """What the registry logs: a models-from-code pyfunc file over the exported program. ``inputs`` /
    ``outputs``: ``[(column, mlflow type)]`` (a None name for one unnamed output); ``meta``: written
    beside the program as ``meta.json``; ``example``: a pandas DataFrame; ``checked``: the worker
    already ran the program on whole splits (no reload needed); ``optional_inputs``: columns a
    client may send that the model does not read (an excluded id): declared optional, of any type,
    in the signature, so MLflow takes them without a warning, and ignored."""

    python_model: Path
    meta: dict
    inputs: list[tuple[str, str]]
    outputs: list[tuple[str | None, str]]
    example: Any
    metadata: dict = field(default_factory=dict)
    checked: bool = False
    optional_inputs: list[str] = field(default_factory=list)
    # ``[(name, mlflow type, default)]``: the inference params ``predict`` takes (the signature's params
    # schema, which MLflow checks, the scoring server too), e.g. a classifier's ``predict_method``.
    params: list[tuple[str, str, Any]] = field(default_factory=list)
    # Distributions the pyfunc imports besides mlflow, torch, pandas and numpy (e.g. ``tokenizers``):
    # pinned at this environment's versions in the logged model's requirements.
    requirements: list[str] = field(default_factory=list)
    # Modules the pyfunc file imports by name, logged into the model's ``code/`` (first on ``sys.path``
    # when it loads) and hashed: the built-in pyfuncs' shared ``pyfunc_common``.
    code_paths: list[Path] = field(default_factory=lambda: [PYFUNC_COMMON])


@dataclass(frozen=True)
class InitFit:
    """Whether ``trainflow init`` can set a task up for some data: ``fits``, ``preferred`` (the
    natural reading, picked when no ``--task`` is given) and ``why`` (said to the user either way)."""

    fits: bool
    preferred: bool
    why: str


@dataclass(frozen=True)
class ParallelPlan:
    """How a task's model splits across ranks; the engine's tp / pp / hybrid strategies apply it.
    ``blocks(model)``: the repeated blocks, in order; ``block_plan()``: the ``parallelize_module``
    plan of one block; ``stage_layers(n_blocks, n_stages)``: block indices per pipeline stage;
    ``split_stage(model, stage, n_stages)``: the model cut to one stage in place, keeping the full
    model's parameter names (the stages' state dicts merge into one)."""

    blocks: Callable[[Any], list]
    block_plan: Callable[[], dict]
    stage_layers: Callable[[int, int], list[list[int]]]
    split_stage: Callable[[Any, int, int], Any]


@dataclass(frozen=True)
class ParamGroup:
    """Parameters the optimizer treats alike (the task says which, ``Task.param_groups``): their
    learning rate is ``lr_scale`` times the run's, and they are not updated in the first
    ``frozen_epochs`` epochs. ``names``: parameter names in the task's model as ``build_model`` returns
    it (the engine matches them through its wrappers). Parameters in no group keep the run's LR."""

    name: str
    names: frozenset[str]
    lr_scale: float = 1.0
    frozen_epochs: int = 0


class Task:
    """Base of every task. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str] = ""
    metrics: ClassVar[tuple[Metric, ...]] = ()
    # Compared with the champion, in this order: the first that differs decides.
    champion_metrics: ClassVar[tuple[str, ...]] = ()
    # The metric a trivial baseline must be beaten on (``gates.baseline_margin``), or None; the config's
    # ``primary_metric`` picks another of ``primary_choices`` (``with_primary``).
    primary: ClassVar[str | None] = None
    # What ``primary_metric`` may name (empty: every metric but the latency).
    primary_choices: ClassVar[tuple[str, ...]] = ()
    # ``[(name, mlflow type, default)]`` of the inference params its registered model takes (``ModelSpec.params``).
    predict_params: ClassVar[list] = []
    # Figures ``val_scores`` computes from the whole validation split's outputs at each epoch's end;
    # ``training.early_stopping.metric`` may follow any as ``val_<name>``.
    val_score_names: ClassVar[tuple[str, ...]] = ()
    # The type of ``info``: the caches read it back from JSON with ``info_type.from_json``.
    info_type: ClassVar[type[DataInfo]] = DataInfo
    # What ``gbdt`` fits, (short, long), as the summary's "vs" row and gate.md name it.
    gbdt_names: ClassVar[tuple[str, str]] = ("GBDT", "gradient-boosted trees")

    # -- config --------------------------------------------------------------------------
    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)

    def primary_names(self) -> tuple[str, ...]:
        """The metrics ``primary_metric`` may name."""
        return self.primary_choices or tuple(m.name for m in self.metrics if m.name != "latency_p95_ms")

    def with_primary(self, name: str | None) -> "Task":
        """This task judging by ``name`` (the config's ``primary_metric``; None: the task's own): the
        baseline and trees gates, the champion regression check and promotion then use that metric
        alone, in its direction. The copy shares what this instance has read."""
        if name is None or name == self.primary:
            return self
        import copy

        if name not in self.primary_names():
            import difflib

            close = difflib.get_close_matches(name, self.primary_names(), 1)
            raise ConfigError(f"primary_metric: task {self.name!r} has no metric {name!r}"
                              + (f" (did you mean {close[0]}?)" if close else "")
                              + f"; choose one of {', '.join(self.primary_names())}")
        task = copy.copy(self)
        task.primary, task.champion_metrics = name, (name,)
        return task

    def check_config(self, cfg: "PipelineConfig") -> None:
        """Raise ConfigError naming the key when ``cfg`` does not fit this task."""
        self.with_primary(getattr(cfg, "primary_metric", None))
        if getattr(cfg.training, "class_weight", "none") != "none" and not isinstance(self, Classifier):
            raise ConfigError(f"training.class_weight: task {self.name!r} is not a classifier; use none")
        names = [m.name for m in self.metrics]
        for key in cfg.gates.thresholds:
            if key not in names:
                raise ConfigError(f"gates.thresholds.{key}: task {self.name!r} has no metric {key!r}; "
                                  f"its metrics: {', '.join(names)}")
        if cfg.gates.baseline_margin is not None and self.primary is None:
            raise ConfigError(f"gates.baseline_margin: task {self.name!r} has no trivial baseline")
        accuracy = self.val_accuracy(0.0, 1) is not None
        if cfg.training.early_stopping.metric == "val_accuracy" and not accuracy:
            raise ConfigError(f"training.early_stopping.metric: task {self.name!r} reports no val_accuracy; "
                              "use val_loss")
        follows = cfg.training.early_stopping.metric
        if follows not in ("val_loss", "val_accuracy") and follows[4:] not in self.val_score_names:
            offered = ", ".join(["val_loss"] + ["val_accuracy"] * accuracy
                                + [f"val_{n}" for n in self.val_score_names])
            raise ConfigError(f"training.early_stopping.metric: task {self.name!r} reports no {follows}; "
                              f"it reports {offered}")
        from core.config import MODEL_PARALLEL

        if cfg.training.strategy in MODEL_PARALLEL and self.parallel_plan(cfg) is None:
            raise ConfigError(f"training.strategy: {cfg.training.strategy!r} (model parallel) needs a model that "
                              f"splits across ranks; task {self.name!r} with model.kind {cfg.model.kind!r} has "
                              "no tp/pp plan: use ddp or fsdp for it")

    def parallel_plan(self, cfg: "PipelineConfig") -> ParallelPlan | None:
        """How this task's model splits for tp / pp / hybrid; None: ddp and fsdp only."""
        return None

    def fsdp_units(self, model) -> list | None:
        """The submodules ``training.strategy: fsdp`` shards one by one before the root (a pretrained
        transformer's blocks); None: the engine's default units (each Linear / Conv layer)."""
        return None

    def init_fit(self, label: str, labels, ctype: str) -> InitFit:
        """Can ``trainflow init`` set this task up for a table's label column ``labels`` (non-null, of ``ctype``)?"""
        return InitFit(False, False, f"task {self.name!r} is not set up by init from a table's label")

    def init_defaults(self) -> dict:
        """Config sections ``trainflow init`` writes for this task (model, gates)."""
        return {}

    def init_table(self, cfg: "PipelineConfig", root: Path, where: str, profile: Callable) -> dict:
        """What ``trainflow init`` makes of a table the task fits (``init_fit``): its frames, choices and
        expectations (``tasks.tabular``)."""
        raise NotImplementedError(f"task {self.name!r} is not set up by init from a table")

    def init_reads(self, target: Path) -> InitFit:
        """Can ``trainflow init`` set this task up for the folder ``target`` (then it answers ``init_folder``)?"""
        return InitFit(False, False, f"task {self.name!r} is set up by init from a table's label, not a folder")

    def init_folder(self, root: Path, target: Path, rel: str) -> dict:
        """What ``trainflow init`` writes for the data folder ``target``: ``{"dataset", "training", "rows",
        "classes", "lines", "problems", "choices" (key paths kept on a re-run), "review"}``."""
        raise NotImplementedError(f"task {self.name!r} is not set up by init from a folder")

    # -- validation (torch-free) -------------------------------------------------------------
    def validation_plan(self, cfg: "PipelineConfig", root: Path):
        """The ``ValidationPlan`` the GX runner (``validation.gx_run``) runs."""
        raise NotImplementedError

    def data_splits(self, cfg: "PipelineConfig") -> dict[str, tuple[str, str]]:
        """``{split: (file relative to the project root, MLflow context "training" | "testing")}``."""
        return {"data": (cfg.dataset.path, "training")}

    # -- training (torch inside) -------------------------------------------------------------
    def info(self, cfg: "PipelineConfig", root: Path) -> DataInfo:
        """What a model of this data is built from (``Splits.info``), fitted on the train split; torch-free."""
        return DataInfo()

    def loader_kind(self, cfg: "PipelineConfig", root: Path) -> tuple[str, str]:
        """(``memory``, ``dataloader`` or ``stream``, why) for ``training.loader.kind`` stream or auto;
        ConfigError where the task cannot stream."""
        if cfg.training.loader.kind == "stream":
            raise ConfigError(f"training.loader.kind: 'stream' reads tables; task {self.name!r} has none "
                              "(use memory or auto)")
        return "memory", f"auto: task {self.name!r} has no table to stream"

    def table_stream(self, cfg: "PipelineConfig", root: Path, data_md5: str):
        """The train split the engine streams by Parquet row groups (``tasks.table_stream.TableStream``),
        where ``loader_kind`` says ``stream``."""
        raise NotImplementedError(f"task {self.name!r} does not stream a table")

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        """``tasks.splits.Splits`` (train / val / test tensors and ``info``)."""
        raise NotImplementedError

    def build_model(self, cfg: "PipelineConfig", info: DataInfo):
        raise NotImplementedError

    def param_groups(self, cfg: "PipelineConfig", model) -> tuple[ParamGroup, ...]:
        """The optimizer's groups of ``model`` (``build_model``'s) other than the default one: e.g. a
        pretrained backbone with a lower learning rate, frozen for the first epochs. None by default: one
        group at the run's LR."""
        return ()

    def to_device(self, cfg: "PipelineConfig", model, device):
        """``build_model``'s model on the training device, before the strategy wraps it (a task may
        pick a memory layout there, e.g. channels_last convolutions on CUDA)."""
        return model.to(device)

    def example_input(self, cfg: "PipelineConfig", info: DataInfo, batch: int = 2):
        raise NotImplementedError

    def loss(self, out, y, reduction: str = "mean"):
        raise NotImplementedError

    def batch_tokens(self, x):
        """The tokens a training batch's inputs hold, padding left out: a number or a tensor on ``x``'s
        device (read once a metrics window, so no step waits for it), giving the window's
        ``tokens_per_s``. None: the task's inputs are not tokens."""
        return None

    def val_correct(self, out, y) -> float:
        """Correct predictions in a batch (0 for a task without accuracy)."""
        return 0.0

    def val_accuracy(self, correct: float, n: int) -> float | None:
        """Per-epoch validation accuracy from the correct predictions summed over ranks; None: the task
        reports none."""
        return correct / max(n, 1)

    def val_scores(self, outputs, y) -> dict[str, float]:
        """``{name: value}`` for ``val_score_names`` from the validation split's model outputs (numpy,
        gathered from every rank, in any row order) and targets."""
        return {}

    def export_files(self, cfg: "PipelineConfig", model, info: DataInfo, out: Path) -> str | None:
        """Rank 0: write the trained model's own files into ``out`` and return the name (a file or folder
        in ``out``) the registry logs; None: the engine exports ``export_module`` as ``model.pt2``."""
        return None

    def export_module(self, model, info: DataInfo):
        """The module exported as ``model.pt2`` (e.g. the trained model plus output de-scaling)."""
        return model

    def write_test_scores(self, cfg: "PipelineConfig", root: Path, out: Path) -> None:
        """Rank 0, after export, optional: ``write_program_scores`` (the pipeline then needs no torch)."""

    def validation_split(self, cfg: "PipelineConfig", root: Path) -> tuple | None:
        """``(x, y)`` of the train rows held out from fitting, in the program's input form, where the
        evaluation tunes what it may (``decision_threshold``); None: nothing is tuned."""
        return None

    def decision_threshold(self, y_val, val_pred) -> float | None:
        """The cut the registered model predicts by, from its decoded predictions on the held-out rows;
        None: the plain decoding."""
        return None

    def threshold_metric(self) -> str | None:
        """The metric ``decision_threshold`` tunes its cut for (named in the summary and ``gate.md``);
        None where the task tunes none."""
        return None

    def with_class_weights(self, y, n_classes: int) -> "Task":
        """This task with its loss weighing each class alike (``training.class_weight: balanced``), from
        the train targets ``y``; a task without classes refuses the key (``check_config``)."""
        raise ConfigError(f"training.class_weight: task {self.name!r} has no classes to weigh")

    # -- evaluation ----------------------------------------------------------------------------
    def evaluator(self):
        """What scores this task's candidate and champion: an object with ``evaluate(task, cfg, root,
        train_dir, out_dir, champion, champion_metrics) -> report`` and ``score_champion(task, cfg, root,
        predictor) -> metrics``; None: ``evaluation.evaluate``'s per-row one, through the hooks below."""
        return None

    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        """``{"key", "split_sha256", "metrics_version"}``: what a score measured now holds for."""
        raise NotImplementedError

    def eval_data(self, cfg: "PipelineConfig", root: Path) -> tuple:
        """``(frame, x, y, info)`` of the evaluation split: x in the program's input form, y the targets."""
        raise NotImplementedError

    def check_program_output(self, out, info: DataInfo) -> None:
        """ValueError when the program's outputs on the evaluation split do not fit ``info``."""

    def decode(self, outputs):
        """The program's outputs -> what ``score`` takes (probabilities, values)."""
        return outputs

    def score(self, y, pred, info: DataInfo, threshold: float | None = None) -> dict:
        """Every metric of ``pred`` against the targets ``y``."""
        raise NotImplementedError

    def baseline(self, cfg: "PipelineConfig", root: Path, info: DataInfo, n: int) -> tuple[str, Any]:
        """(what the trivial predictor is, its ``n`` predictions in ``decode``'s form)."""
        raise NotImplementedError

    def gbdt(self, cfg: "PipelineConfig", root: Path) -> dict | None:
        """The strong conventional model a user would try first, on the same train split (``fit_gbdt``)."""
        return None

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        """A loaded registry model (taking what a serving client sends) scored on the evaluation split."""
        raise NotImplementedError

    def class_names(self, info: DataInfo) -> list[str] | None:
        """A classifier's class names in output order (the confusion matrix's axes); None otherwise."""
        return None

    def recorded_keys(self) -> tuple[str, ...]:
        """What a recorded score dict must hold to stand in for a rescored champion."""
        return tuple(m.name for m in self.metrics if m.name != "latency_p95_ms")

    def drift_frames(self, cfg: "PipelineConfig", root: Path, reference, read: Callable[[Path], bytes]) -> tuple:
        """``(then, now, features)`` for ``retrain.policy: drift``: frames of the champion's training split
        (``reference``: its DatasetConfig, ``read``: a file of its data version) and the workspace's."""
        from core.errors import DataUnavailableError

        raise DataUnavailableError(f"task {self.name!r} has no drift check (retrain.policy: drift compares a "
                                   "table's feature columns)")

    # -- registry ------------------------------------------------------------------------------
    def loaded_model(self) -> type:
        """The class ``registry.models.load_predictor`` wraps this task's loaded pyfunc in."""
        return Predictor

    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        raise NotImplementedError

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        """Before registration: ValueError when the program's output on the spec's example does not fit."""

    def describe(self, cfg: "PipelineConfig", candidate: dict) -> str:
        """One line for the model version's description."""
        shown = ", ".join(f"{k} {candidate[k]:.4f}" for k in self.champion_metrics if k in candidate)
        return f"{cfg.name}: {shown}"


class LoadedModel:
    """A pyfunc loaded from the registry, with where it came from."""

    def __init__(self, pyfunc_model, name: str, alias: str, version: str, run_id: str | None, model_uri: str):
        self.pyfunc, self.name, self.alias, self.version = pyfunc_model, name, alias, version
        self.run_id, self.model_uri = run_id, model_uri

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}@{self.alias} = version {self.version})"


class Predictor(LoadedModel):
    """A loaded registry model of a table: ``predictor(features) -> predictions`` (class labels or values);
    ``features``: a DataFrame of the feature columns, or a ``[rows, n_features]`` array in their order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        schema = self.pyfunc.metadata.get_input_schema()
        self.feature_columns = list(schema.input_names()) if schema is not None else []

    def __call__(self, features):
        import numpy as np

        return np.asarray(self.pyfunc.predict(self._frame(features)))

    def _frame(self, features):
        import numpy as np
        import pandas as pd

        if isinstance(features, pd.DataFrame):
            return features
        values = np.asarray(features)
        return pd.DataFrame(values[None, :] if values.ndim == 1 else values, columns=self.feature_columns)

    def proba(self, features):
        """A classifier's class probabilities: a DataFrame, a column per class named by the label's value;
        None from a model without them (logged before its signature declared ``predict_method``)."""
        declared = self.pyfunc.metadata.get_params_schema()
        if declared is None or "predict_method" not in {p.name for p in declared.params}:
            return None
        return self.pyfunc.predict(self._frame(features), params={"predict_method": "predict_proba"})


class Classifier:
    """What every classifier task shares (mixed in before ``Task``): metrics, cross-entropy on fp32
    logits (optionally class-weighted), accuracy, softmax decoding, labels compared as text, the
    majority-class baseline (the train split's class shares as its probabilities)."""

    metrics = (Metric("accuracy", True), Metric("balanced_accuracy", True), Metric("macro_f1", True),
               Metric("roc_auc", True), Metric("average_precision", True), Metric("log_loss", False),
               Metric("min_class_recall", True), Metric("latency_p95_ms", False))
    champion_metrics = ("accuracy", "macro_f1")
    primary = "accuracy"
    primary_choices = ("accuracy", "balanced_accuracy", "macro_f1", "roc_auc", "average_precision", "log_loss")
    # Per-class loss weights in output order (``training.class_weight: balanced``; ``with_class_weights``).
    class_weights: tuple[float, ...] | None = None

    def recorded_keys(self) -> tuple[str, ...]:
        return ("accuracy", "balanced_accuracy", "macro_f1", "roc_auc", "average_precision", "log_loss",
                "min_class_recall", "predicted_classes", "class_recall", "confusion_matrix", "n")

    def with_class_weights(self, y, n_classes: int):
        """This task with cross-entropy weighted ``n / (k * count)`` per class of the train targets ``y``
        (scikit-learn's ``class_weight="balanced"``; a class absent from ``y`` counts once)."""
        import copy

        import numpy as np

        counts = np.maximum(np.bincount(np.asarray(y, dtype=np.int64).ravel(), minlength=n_classes), 1)
        task = copy.copy(self)
        task.class_weights = tuple(float(w) for w in counts.sum() / (n_classes * counts))
        return task

    def loss(self, out, y, reduction: str = "mean"):
        import torch
        import torch.nn.functional as F

        weight = None if self.class_weights is None else torch.tensor(self.class_weights, device=out.device)
        return F.cross_entropy(out.float(), y.reshape(-1), weight=weight, reduction=reduction)

    def val_correct(self, out, y) -> float:
        return (out.argmax(-1) == y).sum().item()

    val_score_names = ("balanced_accuracy", "macro_f1", "roc_auc", "average_precision", "log_loss")

    def val_scores(self, outputs, y) -> dict[str, float]:
        from tasks.metrics import probability_scores, softmax

        return probability_scores(y, softmax(outputs))

    def decode(self, outputs):
        """The program's logits -> class probabilities [n, k] (float64)."""
        from tasks.metrics import softmax

        return softmax(outputs)

    def encode(self, labels, info):
        """A registered model's predicted labels -> class indices (-1: not a known class)."""
        import numpy as np

        index = {label_key(c): i for i, c in enumerate(info.classes)}
        return np.asarray([index.get(label_key(v), -1) for v in np.asarray(labels).tolist()], dtype=np.int64)

    def encode_proba(self, frame, info):
        """A registered model's ``predict_proba`` DataFrame (a column per class label) -> [n, k] in output
        order; None when it is not one (a model logged before it answered ``predict_proba`` gives labels)."""
        import numpy as np
        import pandas as pd

        if not isinstance(frame, pd.DataFrame) or frame.shape[1] != len(info.classes):
            return None
        at = {label_key(c): j for j, c in enumerate(frame.columns)}
        if any(label_key(c) not in at for c in info.classes):
            return None
        return frame.iloc[:, [at[label_key(c)] for c in info.classes]].to_numpy(dtype=np.float64)

    def class_names(self, info) -> list[str]:
        return [label_key(c) for c in info.classes]

    # ``predict(df, params={"predict_method": "predict_proba"})``: a DataFrame of class probabilities.
    predict_params = [("predict_method", "string", "predict")]

    def decision_threshold(self, y_val, val_pred) -> float | None:
        """Two classes: the cut on class 1's probability that scores best on the held-out rows by
        ``threshold_metric`` (``tasks.metrics.tune_threshold``); more classes: None (the argmax)."""
        import numpy as np

        from tasks.metrics import tune_threshold

        p = np.asarray(val_pred, dtype=np.float64)
        if p.ndim != 2 or p.shape[1] != 2 or len(p) == 0:
            return None
        return tune_threshold(y_val, p[:, 1], self.threshold_metric())[0]

    def threshold_metric(self) -> str:
        """The label metric a binary decision threshold is tuned for: the primary one when it is a label
        metric, else macro-F1 (a ranking primary says nothing about where to cut)."""
        from tasks.metrics import LABEL_METRICS

        return self.primary if self.primary in LABEL_METRICS else "macro_f1"

    def score(self, y, pred, info, threshold: float | None = None, labels=None) -> dict:
        """Every classifier metric of ``pred``: class probabilities [n, k] (labels by ``threshold`` for two
        classes, else the argmax) or class indices [n] (a hard classifier: probability 1 on its label).
        ``labels``: class indices to score the label metrics on instead (a model that cut by itself)."""
        import numpy as np

        from tasks.metrics import classification_metrics, labels_of, ranking_metrics

        k = len(info.classes)
        pred = np.asarray(pred)
        if pred.ndim == 1:
            idx = pred.astype(np.int64)
            proba = np.zeros((len(idx), k))
            ok = (idx >= 0) & (idx < k)
            proba[np.flatnonzero(ok), idx[ok]] = 1.0
        else:
            proba = pred.astype(np.float64)
            idx = labels_of(proba, threshold)
        out = {**classification_metrics(y, idx if labels is None else labels, k), **ranking_metrics(y, proba)}
        if threshold is not None and k == 2 and labels is None:
            out["threshold"] = float(threshold)
        return out

    def majority(self, y, info, n: int) -> tuple[str, Any]:
        """The trivial predictor: the train targets ``y``'s class shares as every row's probabilities,
        so its label is the most frequent class and it ranks no row above another."""
        import numpy as np

        counts = np.bincount(y, minlength=len(info.classes)).astype(np.float64)
        top = int(counts.argmax())
        shares = counts / max(counts.sum(), 1.0)
        return f"majority class {info.classes[top]!r}", np.tile(shares, (n, 1))


@dataclass
class ValidationPlan:
    """What validation runs for a config: ``suite``, the import path of the suite module the GX runner
    runs (``validation.gx_run``: its ``run(params, report_dir)``), ``files`` hashed for the cache key,
    ``params`` handed to the suite (torch-free values)."""

    suite: str
    files: list[Path]
    params: dict
