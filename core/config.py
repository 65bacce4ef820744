"""Typed pipeline configuration: YAML -> pydantic models that fail at load, every error naming the
key path (``training.lr: must be > 0, got -1``). The canonical JSON of a loaded config hashes to
the config id. The defaults hold for any task and dataset; what one pipeline is comes from its
YAML in ``configs/`` (required: ``name`` and ``dataset.path``; the task requires what only it needs).
This module holds the keys every run shares; a task's own keys come from its options model
(``register_options``); which keys the config id hashes: ``core/config_id.py``.
"""

from __future__ import annotations

import copy
import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, get_args

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from core.config_id import (  # noqa: F401 - LAYOUT_KEYS, NOT_IN_CONFIG_ID: read through core.config too
    ID_LATER_KEYS, LAYOUT_KEYS, NOT_IN_CONFIG_ID, add_later_key, config_id_of, resume_id_of)
from core.errors import ConfigError


class _Strict(BaseModel):
    # No inf / NaN anywhere: `.inf` for a timeout means no deadline, NaN passes no comparison.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# A name that becomes one path component and an MLflow name: never "..", "/" or empty.
SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_slug(value: str) -> str:
    """``value`` if it is a slug (``SLUG``), else ValueError (pydantic names the key)."""
    if not SLUG.match(value):
        raise ValueError(f"must be a slug (a letter or digit, then letters, digits, '.', '_' or '-', "
                         f"at most 100), got {value!r}")
    return value


Slug = Annotated[str, AfterValidator(check_slug)]


def check_ranges(model: BaseModel, names: tuple[str, ...]) -> Any:
    """``model``, unless one of its ``(lower, upper)`` fields ``names`` is negative or reversed."""
    for name in names:
        lo, hi = getattr(model, name)
        if lo < 0:
            raise ValueError(f"{name}: lower bound must be >= 0, got {lo}")
        if lo > hi:
            raise ValueError(f"{name}: lower bound {lo} is above upper bound {hi}")
    return model


class DatasetConfig(_Strict):
    """Where the DVC-tracked data lives and which of its columns the task reads.

    Tables (CSV or Parquet, by file suffix) come pre-split (``train_file`` + ``test_file``) or as
    one ``file`` that is split into train and test with ``test_fraction`` and the config's seed.
    ``features``: the feature columns by name; null means every column but ``label`` and
    ``exclude``. A text corpus (the ``lm`` task) is described by ``text`` instead, an image folder
    by ``images``: each task adds its own keys (``tasks/*_options.py``).
    """

    # The data folder, relative to the repository root.
    path: str = Field(min_length=1)
    # The DVC file whose md5 is the data version; left out: ``<path>.dvc``, what ``dvc add <path>`` writes.
    dvc_file: str = Field(default_factory=lambda data: data["path"].rstrip("/") + ".dvc", min_length=1)
    # Pre-split files (null: train.csv / test.csv), or one ``file`` split by seed.
    train_file: str | None = None
    test_file: str | None = None
    file: str | None = None
    # Share of ``file``'s rows that become the test split (stratified by class for classification).
    test_fraction: float = Field(0.2, gt=0, lt=1)
    label: str = Field("label", min_length=1)
    features: list[str] | None = None
    exclude: list[str] = []
    # Share of the training split held out for per-epoch validation.
    val_fraction: float = Field(0.1, gt=0, lt=1)
    # The reviewed per-column expectations (``trainflow init`` writes them), relative to the root.
    expectations_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetConfig":
        if self.file is not None and (self.train_file is not None or self.test_file is not None):
            raise ValueError("file: give either file (split with test_fraction) or train_file and test_file")
        if self.features is not None:
            if not self.features:
                raise ValueError("features: must name at least one column (or be null: every column but the label)")
            dup = sorted({c for c in self.features if self.features.count(c) > 1})
            if dup:
                raise ValueError(f"features: duplicate column(s) {dup}")
            if self.label in self.features:
                raise ValueError(f"features: contains the label column {self.label!r}")
            if self.exclude:
                raise ValueError("exclude: only with features: null (every column but the label and these)")
        for check in _CHECKS["dataset"]:
            check(self)
        return self

    @property
    def split_files(self) -> dict[str, str]:
        """``{"train": name, "test": name}``, or ``{"all": name}`` for one file split by seed."""
        if self.file is not None:
            return {"all": self.file}
        return {"train": self.train_file or "train.csv", "test": self.test_file or "test.csv"}


class ModelConfig(_Strict):
    """The network. ``kind`` picks a built-in (for a table: tabular, mlp or cnn; lm: a byte-level
    decoder-only transformer); ``factory: "module.path:function"`` names the user's own instead,
    importable from the repository, called as ``function(n_inputs, n_outputs, **kwargs)``.
    ``kind`` left out: the task's own network (a table task's is tabular, which fits any table;
    cnn needs a square number of numeric features, an image; the lm task needs lm). Null rather
    than tabular, so a task with a network of its own can tell a kind someone chose from none.

    A table's columns reach any of them through one input layer (``tasks/table_nets.py``): each
    numeric column transformed (``numeric``) with a missing-indicator where the train split had
    gaps, optionally embedded as periodic features (``periodic``), each category embedded."""

    kind: Literal["tabular", "cnn", "mlp", "lm", "image_cnn", "resnet18", "resnet50"] | None = None
    factory: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    kwargs: dict[str, Any] = {}
    channels: tuple[int, int] = (16, 32)
    hidden: int = Field(128, gt=0)
    dropout: float = Field(0.1, ge=0, lt=1)


# The validation figures early stopping can follow; each improves in its direction (True: higher).
# Beyond loss and accuracy they are scored by the task on the gathered validation outputs.
EARLY_STOPPING_METRICS = {"val_loss": False, "val_accuracy": True, "val_balanced_accuracy": True,
                          "val_macro_f1": True, "val_roc_auc": True, "val_average_precision": True,
                          "val_log_loss": False}


class EarlyStopping(_Strict):
    """Stop when ``metric`` has not improved by ``min_delta`` for ``patience`` epochs (off when null).
    ``restore_best``: with patience set, the model trained, exported and registered is the best
    validation epoch's (by ``metric``, in its direction), not the last one's."""

    metric: Literal["val_loss", "val_accuracy", "val_balanced_accuracy", "val_macro_f1", "val_roc_auc",
                    "val_average_precision", "val_log_loss"] = "val_loss"
    patience: int | None = Field(None, gt=0)
    min_delta: float = Field(0.0, ge=0)
    # With patience set: end with the best validation epoch's weights (exported, registered), not the last's.
    restore_best: bool = True


class LoaderConfig(_Strict):
    """How batches reach the model. ``memory``: slices of the in-memory tensors (fastest for
    data that fits); ``dataloader``: a torch DataLoader with workers, pinned memory, prefetch;
    ``stream``: Parquet row groups read on demand (``training/stream.py``: data beyond memory);
    ``auto``: ``stream`` when the train split's files exceed ``stream_above_mb``, else ``memory``
    (the choice is logged). ``training.loader: auto`` is short for ``{kind: auto}``."""

    kind: Literal["memory", "dataloader", "stream", "auto"] = "memory"
    num_workers: int = Field(0, ge=0)
    pin_memory: bool = False
    # Batches each worker loads ahead (DataLoader; needs num_workers > 0).
    prefetch_factor: int | None = Field(None, gt=0)
    # auto: stream a train split larger than this on disk (MiB).
    stream_above_mb: float = Field(1024, gt=0)
    # stream: row groups shuffled together (the shuffle's window; memory holds about two windows' share).
    shuffle_row_groups: int = Field(8, gt=0)
    # stream: per-epoch validation rows held out at most (about; bounded whatever the data's size).
    val_rows: int = Field(65536, gt=0)
    # stream: a CSV train file larger than this (MiB) is converted once to Parquet in the cache.
    csv_parquet_above_mb: float = Field(256, ge=0)

    @model_validator(mode="after")
    def _prefetch_needs_workers(self) -> "LoaderConfig":
        if self.prefetch_factor is not None and self.num_workers == 0:
            raise ValueError("prefetch_factor: needs num_workers > 0")
        if self.kind != "dataloader" and (self.num_workers or self.pin_memory):
            raise ValueError(f"kind: {self.kind!r} has no workers or pinned memory; use kind: dataloader")
        return self


class ParallelConfig(_Strict):
    """Model-parallel degrees (strategies tp | pp | hybrid; model.kind lm only).

    Data-parallel degree = world size / (tp x pp). ``microbatches``: pipeline micro-batches
    per batch (the batch must split into them); ``schedule``: GPipe (all forwards, then all
    backwards) or 1F1B (interleaved, fewer activations alive at once).
    """

    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    microbatches: int = Field(4, gt=0)
    schedule: Literal["gpipe", "1f1b"] = "gpipe"


MODEL_PARALLEL = ("tp", "pp", "hybrid")


def check_parallel(strategy: str, parallel: ParallelConfig, world_size: int) -> None:
    """ValueError naming the keys when ``training.parallel`` does not fit ``strategy`` and the world
    (tp: tp == world, pp 1; pp: pp == world, tp 1; hybrid: a dp x tp mesh, pp 1, tp > 1, dp > 1)."""
    if strategy not in MODEL_PARALLEL:
        return
    tp, pp = parallel.tp, parallel.pp
    if world_size % (tp * pp):
        raise ValueError(f"training.parallel: tp ({tp}) x pp ({pp}) must divide the world size {world_size}")
    dp = world_size // (tp * pp)
    if strategy == "tp" and not (pp == 1 and tp > 1 and dp == 1):
        raise ValueError(f"training.parallel: strategy 'tp' needs tp == world size ({world_size}) and pp 1, "
                         f"got tp {tp}, pp {pp}; for data x tensor parallel use strategy 'hybrid'")
    if strategy == "pp" and not (tp == 1 and pp > 1 and dp == 1):
        raise ValueError(f"training.parallel: strategy 'pp' needs pp == world size ({world_size}) and tp 1, "
                         f"got tp {tp}, pp {pp}")
    if strategy == "hybrid" and not (pp == 1 and tp > 1 and dp > 1):
        raise ValueError(f"training.parallel: strategy 'hybrid' is data x tensor parallel: needs pp 1, tp > 1 "
                         f"and world size / tp > 1, got tp {tp}, pp {pp}, world size {world_size}")


class RendezvousConfig(_Strict):
    """How torchrun's agents form (and re-form) one world over c10d: several nodes, or an
    elastic ``--nnodes MIN:MAX`` (torch's own defaults). After a node dies, the survivors
    continue after about ``keep_alive_s * 3 + last_call_s``; a node that joins is taken in
    at once when it completes MAX, else after ``last_call_s``."""

    # Once MIN agents are present, wait this long for more before starting with fewer.
    last_call_s: int = Field(30, gt=0)
    # Agents write a heartbeat this often; one silent for 3 of them is taken as gone.
    keep_alive_s: int = Field(5, gt=0)
    # Agents give up when MIN of them have not met within this long (a start or a re-form).
    join_timeout_s: int = Field(600, gt=0)


class CompileConfig(_Strict):
    """``torch.compile`` of the model (``training.compile: true`` is short for ``{enabled: true}``).

    single / ddp / fsdp only: the strategy compiles what it wrapped (``Strategy.compile``);
    checkpoints, the exported program and the registered weights keep the plain module's keys,
    so a run resumes with compile switched on or off. ``mode`` and ``backend`` are
    ``torch.compile``'s; ``inductor`` needs a C++ compiler on CPU (``eager`` / ``aot_eager``
    only check that the model traces).
    """

    enabled: bool = False
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"


class TrainingConfig(_Strict):
    # single: one process; ddp: replicas; fsdp: parameters, grads and optimizer state sharded.
    # tp / pp / hybrid: model parallel (tensor, pipeline, data x tensor) for model.kind lm;
    # degrees in `parallel`. auto: training.plan.plan_launch picks one of single/ddp/fsdp.
    strategy: Literal["single", "ddp", "fsdp", "tp", "pp", "hybrid", "auto"] = "ddp"
    parallel: ParallelConfig = ParallelConfig()
    # bf16 autocast applies on CUDA only; CPU runs stay fp32.
    precision: Literal["fp32", "bf16"] = "fp32"
    epochs: int = Field(12, gt=0)
    # Per-worker batch; global batch = batch_size * world_size * grad_accum.
    batch_size: int = Field(32, gt=0)
    grad_accum: int = Field(1, gt=0)
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(0.002, gt=0)
    weight_decay: float = Field(0.0001, ge=0)
    # The LR above is tuned for base_batch; it is scaled to the global batch. A resume on another
    # world size keeps the checkpoint's global batch where it divides; otherwise this rule rescales.
    lr_scaling: Literal["linear", "sqrt", "none"] = "sqrt"
    base_batch: int = Field(32, gt=0)
    warmup_epochs: float = Field(1.0, ge=0)
    grad_clip: float | None = Field(1.0, gt=0)
    # Classifiers: balanced weighs each class's cross-entropy by n / (classes * its train rows), so a
    # rare class counts as much as a common one (scikit-learn's class_weight="balanced").
    class_weight: Literal["balanced", "none"] = "none"
    # Worker processes per node when no GPU is present. auto: the advisor picks processes and
    # threads_per_worker (from a `trainflow scale` sweep when one exists, else a rule).
    cpu_workers: int | Literal["auto"] = 2
    threads_per_worker: int = Field(1, gt=0)
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # torchrun restarts the worker group this often after a worker dies (or a node leaves an
    # elastic --nnodes MIN:MAX job: each departure costs every survivor one; a join costs none).
    max_restarts: int = Field(3, ge=0)
    rendezvous: RendezvousConfig = RendezvousConfig()
    collective_timeout_s: float = Field(120, gt=0)
    # Wall-clock budget of the whole torchrun job.
    timeout_s: float = Field(900, gt=0)
    # After SIGTERM, ranks checkpoint at the next agreement check; killed after this many seconds.
    preempt_grace_s: float = Field(30, gt=0)
    # Ranks agree on a pending SIGTERM every N steps (an all-reduce; every step cost ~2 %).
    preempt_check_steps: int = Field(10, gt=0)
    checkpoint_every_epochs: int = Field(1, gt=0)
    # Also checkpoint inside an epoch every N optimizer steps (null: epoch ends only).
    checkpoint_every_steps: int | None = Field(None, gt=0)
    # fixed: the two intervals above as written. auto: once a worker has died in this training, the
    # mid-epoch interval is Young-Daly's sqrt(2 x checkpoint cost x MTBF), both measured by the
    # goodput ledger (training/goodput.py), in steps; until then checkpoint_every_steps.
    checkpoint_every: Literal["fixed", "auto"] = "fixed"
    # A due epoch-end checkpoint (not the last epoch's, an early stop's or a preemption's) is skipped
    # while rank 0's checkpoints have cost more than this share of the training time (short epochs
    # would otherwise pay a whole save each); null: every due one is written.
    checkpoint_budget: float | None = Field(0.01, gt=0, lt=1)
    # >= 2: the newest checkpoint can be unreadable after a crash, and resume then needs the one before.
    keep_checkpoints: int = Field(2, ge=2)
    # Off: no checkpoints are written or resumed (benchmarks, throwaway runs).
    checkpoints: bool = True
    # Off: no step timing, all-reduce timing or perf/* metrics.
    metrics: bool = True
    loader: LoaderConfig = LoaderConfig()
    deterministic: bool = True
    early_stopping: EarlyStopping = EarlyStopping()
    log_every_steps: int = Field(20, gt=0)
    # A rank whose compute time per step (step time less data and all-reduce waits) exceeds the
    # other ranks' median by this factor is a straggler (training.metrics.find_straggler).
    straggler_ratio: float = Field(1.5, gt=1)
    # Peak accelerator FLOP/s per device for the MFU estimate (CUDA only; null: no MFU).
    peak_tflops: float | None = Field(None, gt=0)
    # torch.compile the model (single / ddp / fsdp); `compile: true` is `{enabled: true}`.
    compile: CompileConfig = CompileConfig()

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_bool_alone(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v

    @field_validator("loader", mode="before")
    @classmethod
    def _loader_kind_alone(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v  # `loader: auto` is `loader: {kind: auto}`

    @field_validator("cpu_workers", mode="before")
    @classmethod
    def _workers_int_or_auto(cls, v: Any) -> Any:
        if v == "auto":
            return v
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"must be a positive integer or 'auto', got {v!r}")
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        return v

    @model_validator(mode="after")
    def _single_is_one_process(self) -> "TrainingConfig":
        if self.compile.enabled and self.strategy in MODEL_PARALLEL:
            # DTensor-parallel layers and pipeline stages are not compiled here: refuse rather than
            # run a layout nobody tested under torch.compile.
            raise ValueError(f"compile: supported with strategy single, ddp, fsdp or auto, "
                             f"not {self.strategy!r} (set training.compile: false)")
        if self.strategy == "single" and isinstance(self.cpu_workers, int) and self.cpu_workers != 1:
            raise ValueError(f"strategy: 'single' runs one process, but training.cpu_workers is {self.cpu_workers}")
        if isinstance(self.cpu_workers, int):
            try:
                check_parallel(self.strategy, self.parallel, self.cpu_workers)
            except ValueError as exc:
                raise ValueError(f"{exc} (training.cpu_workers)") from None
        if self.checkpoint_every == "auto" and not self.checkpoints:
            raise ValueError("checkpoint_every: 'auto' picks when to checkpoint, but training.checkpoints is false")
        if self.strategy == "pp" and self.parallel.schedule == "1f1b" and self.parallel.microbatches < self.parallel.pp:
            raise ValueError(f"parallel: schedule 1f1b needs microbatches >= pp ({self.parallel.pp}), "
                             f"got {self.parallel.microbatches}")
        if self.strategy == "pp" and self.batch_size % self.parallel.microbatches:
            raise ValueError(f"parallel: microbatches ({self.parallel.microbatches}) must divide "
                             f"training.batch_size ({self.batch_size})")
        return self


class GatesConfig(_Strict):
    """Absolute thresholds, the trivial baseline and the allowed regression against the champion.

    ``thresholds``: metric name -> bound; the task says each metric's direction, so a metric where
    higher is better must be >= its bound and one where lower is better <= it. ``baseline_margin``:
    the candidate must beat the task's trivial baseline (majority class, mean predictor) on the
    task's primary metric by at least this much (null: no baseline gate). ``max_regression``: the
    candidate may trail the champion by at most this much in each metric the task compares it on
    (absolute, or a relative factor where the task says so, e.g. perplexity).
    """

    thresholds: dict[str, float] = {}
    baseline_margin: float | None = Field(None, ge=0)
    max_regression: float = Field(0.005, ge=0)
    # Promotion: the candidate replaces @champion only when it beats it by more than this on the
    # first champion metric that differs by more than this (a factor of the champion's value for a
    # relative metric); closer on every one is a tie, registered as @challenger and not promoted.
    min_improvement: float = Field(0.001, ge=0)
    # Tables: fail the candidate when its primary metric trails scikit-learn's gradient-boosted trees,
    # fitted on the same train split, by more than this (null: reported, not gated).
    max_gap_to_gbdt: float | None = Field(None, ge=0)
    # Fail the candidate when its primary metric trails the task's conventional baseline model, fitted
    # on the same train split (text: TF-IDF + logistic regression; tables: the trees), by more than
    # this (null: reported, not gated).
    max_gap_to_baseline: float | None = Field(None, ge=0)
    # Classifiers: a candidate that predicts one class for every test row fails (false), whatever its
    # scores; true lets such a model through.
    allow_single_class: bool = False


class RegistryConfig(_Strict):
    """Where the model is registered. Left out, ``model_name`` is the pipeline's ``name`` and
    ``experiment`` is ``trainflow-<name>`` (``PipelineConfig``)."""

    # A slug: it names the registered model, its promotion lock file and (with `name`) folders.
    model_name: Slug = Field(min_length=1)
    experiment: str = Field(min_length=1)
    promotion: Literal["auto", "manual"] = "auto"


class RetrainConfig(_Strict):
    """When the ``retrain`` flow trains a new candidate instead of keeping the champion.

    A feature drifts when its PSI (binned on the champion's training-data quantiles) is above
    ``psi_threshold`` or its two-sample KS test's p-value is below ``ks_pvalue``; the dataset
    drifts when more than ``max_drifted_fraction`` of the features drift. ``policy: any_change``
    trains on every new data version (the drift report is still written); ``drift`` trains on a
    new data version only when it drifted. A changed config or code, or ``force``, always trains.
    """

    policy: Literal["any_change", "drift"] = "any_change"
    psi_threshold: float = Field(0.2, gt=0)
    ks_pvalue: float = Field(0.01, gt=0, lt=1)
    max_drifted_fraction: float = Field(0.1, ge=0, lt=1)
    # Quantile bins per feature for PSI (fewer when the reference has fewer distinct values).
    psi_bins: int = Field(10, ge=2)


# A value that becomes one word of an ``#SBATCH`` line: no spaces, quotes or newlines.
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class SlurmRestConfig(_Strict):
    """Slurm's REST API (``slurmrestd``, its OpenAPI plugin v0.0.38) in place of ``sbatch``,
    ``scontrol`` and ``scancel`` on this host."""

    # slurmrestd's address: http(s)://host[:port], no path.
    url: str = Field(pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")
    # The environment variable that holds the JWT (`scontrol token`): the token never goes in a config.
    token_env: str = Field("SLURM_JWT", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    # The user the token is for (X-SLURM-USER-NAME); null: this process's user.
    user: str | None = Field(None, pattern=SLURM_NAME)


class SlurmConfig(_Strict):
    """Where ``--launcher slurm`` runs the training job: typed ``sbatch`` options (no free-form
    ``#SBATCH`` lines: from a deployment parameter they would be code). ``training.slurm`` renders
    the batch script from these and the launch plan."""

    # null: the cluster's defaults.
    partition: str | None = Field(None, pattern=SLURM_NAME)
    account: str | None = Field(None, pattern=SLURM_NAME)
    qos: str | None = Field(None, pattern=SLURM_NAME)
    # The job's time limit (sbatch --time), in minutes.
    time_limit_min: int = Field(60, gt=0)
    # GPUs each node asks for (sbatch --gpus-per-node); 0: none asked.
    gpus_per_node: int = Field(0, ge=0)
    # Slurm sends `signal` to the job's processes this many seconds before the time limit (0: none).
    signal_before_limit_s: int = Field(120, ge=0)
    signal: Literal["TERM", "USR1", "USR2", "INT"] = "TERM"
    # Slurm may requeue the job after a node failure or preemption (sbatch --requeue / --no-requeue).
    requeue: bool = True
    # Run every node's torchrun in this image through pyxis (srun --container-image); null: no container.
    container_image: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@#+-]{0,255}$")
    # A folder every node sees (absolute path): the training folder must be inside it; mounted
    # into the container at the same path.
    shared_dir: str | None = Field(None, pattern=r"^/[A-Za-z0-9._/+-]*$")
    # The nodes' Python (absolute path, or a name on PATH): null is this interpreter, which nodes
    # see when the checkout's virtualenv is on a shared path; `python` inside a container.
    python: str | None = Field(None, pattern=r"^[A-Za-z0-9._/+-]{1,255}$")
    # The c10d rendezvous port on the allocation's first node.
    rdzv_port: int = Field(29400, ge=1, le=65535)
    # How long the job may wait in the queue (PENDING) before the run cancels it and fails; the
    # time limit above bounds its training apart from this.
    queue_limit_s: int = Field(3600, gt=0)
    # Submit, follow and cancel through slurmrestd; null: the Slurm commands on this host.
    rest: SlurmRestConfig | None = None


# A Kubernetes object name: a DNS label (RFC 1123).
K8S_NAME = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# A resource quantity (cpu "8", "500m"; memory "64Gi").
K8S_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|[KMGTPE]i?)?$"


class KubernetesConfig(_Strict):
    """Where ``--launcher kubernetes`` runs the training job: typed keys that ``training.kube`` renders
    into an indexed Job (+ headless Service) or a Kubeflow Trainer v2 TrainJob (no free-form pod-spec
    fragments: from a deployment parameter they would be code)."""

    # job: an indexed Job + headless Service; trainjob: a TrainJob on the cluster's training runtime.
    flavour: Literal["job", "trainjob"] = "job"
    namespace: str = Field("default", pattern=K8S_NAME)
    # The pods' image, pinned: REPO@sha256:<64 hex> (a tag could move between the pods' pulls).
    image: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,255}@sha256:[0-9a-f]{64}$")
    # The repository every pod clones (it checks out the run's commit and pulls its data with DVC).
    git_repo: str | None = Field(None, pattern=r"^(https://|ssh://|git@)[A-Za-z0-9._~:/@+-]{1,500}$")
    # nvidia.com/gpu per pod (0: none asked); the plan's workers per node run in each pod.
    gpus_per_node: int = Field(0, ge=0)
    cpu: str = Field("8", pattern=K8S_QUANTITY)
    memory: str = Field("64Gi", pattern=K8S_QUANTITY)
    service_account: str | None = Field(None, pattern=K8S_NAME)
    # A ReadWriteMany claim every pod mounts at /shared: checkpoints and results (job flavour; a
    # TrainJob's runtime mounts its own).
    shared_pvc: str = Field("trainflow-shared", pattern=K8S_NAME)
    # Where the flow's host mounts that claim (absolute path; `trainflow run --launcher kubernetes`
    # requires it): the run's training folder must be inside it, and the pods see it at
    # /shared/<the same path below it>; the flow reads the result and metrics from there.
    shared_dir: str | None = Field(None, pattern=r"^/[A-Za-z0-9._/+-]*$")
    # A Secret with MLFLOW_TRACKING_USERNAME/PASSWORD for a tracking server with auth.
    mlflow_secret: str | None = Field(None, pattern=K8S_NAME)
    # trainjob: the ClusterTrainingRuntime the TrainJob names.
    runtime: str = Field("torch-distributed", pattern=K8S_NAME)
    # The job's time on the cluster (activeDeadlineSeconds; null: none): past it, it resumes in a new job.
    active_deadline_s: int | None = Field(None, gt=0)
    # A job whose pods have not all started after this many seconds is deleted and the run fails.
    pending_timeout_s: int = Field(1800, gt=0)
    # How often the launcher reads the job's state and pod 0's log.
    poll_s: float = Field(5.0, gt=0, le=300)


class LauncherConfig(_Strict):
    """Cluster settings of the launchers other than the local torchrun (``--launcher``)."""

    slurm: SlurmConfig = SlurmConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()


def _registry_of(name: Any, given: dict) -> dict | None:
    """The registry section with ``model_name`` ``name`` and ``experiment`` ``trainflow-<name>``
    where ``given`` leaves them out (None without a name: that error is the name's)."""
    if not isinstance(name, str):
        return given or None
    return {"model_name": name, "experiment": f"trainflow-{name}", **given}


class PipelineConfig(_Strict):
    # A slug: it names this pipeline's training folders under TRAINFLOW_HOME (training/slots.py).
    name: Slug = Field(min_length=1)
    # The kind of problem: a built-in task (classification, regression, lm) or one a package
    # registers under the ``trainflow.tasks`` entry-point group. The task checks the rest.
    task: str = Field("classification", pattern=r"^[a-z][a-z0-9_\-]*$")
    seed: int = 0
    dataset: DatasetConfig
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    gates: GatesConfig = GatesConfig()
    registry: RegistryConfig = Field(default_factory=lambda data: RegistryConfig(**_registry_of(data["name"], {})))
    retrain: RetrainConfig = RetrainConfig()
    # The metric that judges a candidate: the baseline and trees gates, the champion check and promotion,
    # in its direction (null: the task's own, e.g. accuracy; the task says which names it takes, e.g. a
    # classifier's accuracy, balanced_accuracy, macro_f1, roc_auc, average_precision, log_loss).
    primary_metric: str | None = Field(None, min_length=1)
    launcher: LauncherConfig = LauncherConfig()

    @model_validator(mode="before")
    @classmethod
    def _task_options_known(cls, data: Any) -> Any:
        if not any(_OPTIONS.values()):
            raise RuntimeError("core.config: no task has registered its config options; import tasks before "
                               "validating a config")
        return data

    @model_validator(mode="before")
    @classmethod
    def _registry_names_of_name(cls, data: Any) -> Any:
        """``registry.model_name`` and ``registry.experiment`` left out: named after ``name``."""
        if isinstance(data, dict) and isinstance(data.get("registry"), dict):
            return {**data, "registry": _registry_of(data.get("name"), data["registry"])}
        return data  # no section (the field's default), a RegistryConfig, or a wrong type pydantic names

    def config_id(self) -> str:
        """sha256 of the canonical JSON (``config_id_of``): equal configs hash equal, whatever the
        YAML looked like."""
        return config_id_of(self.model_dump(mode="json"))

    def resume_id(self) -> str:
        """The config id without ``LAYOUT_KEYS``: what a checkpoint must match to be resumed without
        --force-resume (a checkpoint resumes on another world size or strategy; what is learned may
        not change)."""
        return resume_id_of(self.model_dump(mode="json"))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# -- A task's own keys ----------------------------------------------------------------------------
# A task's config options are a pydantic model beside the task (tasks/*_options.py, or a plugin's
# own module) that adds its keys to a shared section: "dataset", "model", or "" for a top-level
# section of its own (``pretrained``). core imports nothing of tasks/, so the task registers its
# model here when its module is imported (``tasks/__init__.py`` imports the built-ins' and every
# room's package imports ``tasks``), and the section is rebuilt with those keys: the YAML shape,
# the errors' key paths and the dumped config stay those of one schema. Every key a task adds is a
# later key of the config id (core/config_id.py), left out of it while at its default, so which
# tasks a process has loaded never moves an id.
class Options(_Strict):
    """The base of a task's options model (``register_options``)."""


_SECTIONS: dict[str, type[BaseModel]] = {"": PipelineConfig, "dataset": DatasetConfig, "model": ModelConfig}
_OPTIONS: dict[str, list[type[BaseModel]]] = {name: [] for name in _SECTIONS}
# Checks of a task's dataset keys against the shared ones (e.g. the label), run by DatasetConfig.
_CHECKS: dict[str, list[Callable[[Any], None]]] = {"dataset": []}
# Called with a config's ``task`` before ``config_from_dict`` validates it: ``tasks`` adds one that
# imports a plugin task's module, so the options it registers are known when its config loads.
TASK_LOADERS: list[Callable[[Any], None]] = []


def register_options(section: str, options: type[BaseModel], check: Callable[[Any], None] | None = None) -> None:
    """Add the keys of ``options`` to ``section`` ("dataset", "model", or "" for top-level ones).
    Its fields join the section, its validators do not: a check of its keys against the shared
    ones is ``check(dataset)``, for "dataset" only, run on the validated section (ValueError("key: why")).
    A key the section already has is refused (ValueError); registering a model again does nothing."""
    if options in _OPTIONS[section]:
        return
    target = _SECTIONS[section]
    taken = sorted(set(options.model_fields) & set(target.model_fields))
    if taken:
        raise ValueError(f"{options.__name__}: {section or 'the top level'} already has {', '.join(taken)}")
    for name, field in options.model_fields.items():
        target.model_fields[name] = field
        add_later_key((section, name) if section else (name,), _json_default(field))
    _OPTIONS[section].append(options)
    if check:
        _CHECKS[section].append(check)  # a KeyError for any section but dataset
    target.model_rebuild(force=True)
    PipelineConfig.model_rebuild(force=True)


def options_of(section: type[BaseModel]) -> list[type[BaseModel]]:
    """The options models registered into the section model ``section``, in order."""
    return [m for name, cls in _SECTIONS.items() if cls is section for m in _OPTIONS[name]]


def _json_default(field: Any) -> Any:
    """A field's default as a config dumped to JSON holds it."""
    value = field.get_default(call_default_factory=True)
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else (
        list(value) if isinstance(value, tuple) else value)


for _path in ID_LATER_KEYS:
    _cls = PipelineConfig
    for _part in _path[:-1]:
        _cls = _cls.model_fields[_part].annotation
    add_later_key(_path, _json_default(_cls.model_fields[_path[-1]]))

_MESSAGES = {
    "greater_than": "must be > {gt}", "greater_than_equal": "must be >= {ge}", "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}", "extra_forbidden": "unknown key", "missing": "required key is missing",
    "literal_error": "must be one of {expected}", "finite_number": "must be a finite number",
    "string_pattern_mismatch": "must match {pattern}",
}


def _num(v: Any) -> Any:
    """0.0 -> 0 in messages: the user wrote ``> 0``."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _format_errors(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line for all of ``err``'s errors, each ``key.path: message``; an unknown key of
    ``model`` (default: PipelineConfig) gets a did-you-mean from its section's keys."""
    model = model or PipelineConfig
    lines = []
    for e in err.errors():
        if e["type"] == "default_factory_not_called":
            continue  # a default made from another key (dataset.dvc_file, registry): that key's error says it
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        template = _MESSAGES.get(e["type"])
        if e["type"] == "value_error":
            # A model validator's "field: message" names the field below this path.
            msg = str(e["ctx"]["error"])
            field_, sep, rest = msg.partition(": ")
            if sep and field_.startswith(path.split(".")[0] + ".") and path != "<root>":
                path, msg = field_, rest  # a full key path below the root, e.g. training.parallel
            elif sep and all(p.isidentifier() for p in field_.split(".")):
                path, msg = (f"{path}.{field_}" if path != "<root>" else field_), rest
            lines.append(f"{path}: {msg}")
            continue
        ctx = {k: _num(v) for k, v in e.get("ctx", {}).items()}
        msg = template.format(**ctx) if template else e["msg"].lower()
        if e["type"] == "extra_forbidden":
            msg += _did_you_mean(model, [str(p) for p in e["loc"]])
        elif e["type"] != "missing":
            msg += f", got {e['input']!r}"
        lines.append(f"{path}: {msg}")
    return "; ".join(lines)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X``, ``X | None``, ``list[X]``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _did_you_mean(model: type[BaseModel], loc: list[str]) -> str:
    """`` (did you mean training.epochs?)`` for the unknown key at ``loc``, or "" when no key of
    its section is close. Walks the schema along ``loc``; a part that is no field (a list index)
    stays in the same section."""
    section: list[type[BaseModel]] = [model]
    for part in loc[:-1]:
        below = [m for s in section if part in s.model_fields for m in _models_in(s.model_fields[part].annotation)]
        section = below or section
    keys = sorted({k for s in section for k in s.model_fields})
    close = difflib.get_close_matches(loc[-1], keys, n=1)
    return f" (did you mean {'.'.join([*loc[:-1], close[0]])}?)" if close else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line of a YAML error: where and what (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark else problem


def _check_unique_keys(node: yaml.Node, path: list[str], seen: set[int]) -> None:
    """ConfigError naming the key path of the first mapping key written twice (YAML keeps the last)."""
    if id(node) in seen:  # an alias of a node checked already (or a recursive one)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else "?"
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = key.start_mark.line + 1
                if (key.tag, key.value) in lines:
                    raise ConfigError(f"{'.'.join([*path, name])}: duplicate key (lines "
                                      f"{lines[key.tag, key.value]} and {line}); give each key once")
                lines[key.tag, key.value] = line
            _check_unique_keys(value, [*path, name], seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, [*path, str(i)], seen)


def load_yaml(text: str, key: str = "") -> Any:
    """Safe-load YAML, refusing duplicate mapping keys. Raises ConfigError in one line, naming the
    key path (below ``key``, the override's key when ``text`` is its value) or the line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique_keys(node, [key] if key else [], set())
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        what = f"cannot parse {text!r} as a YAML value" if key else "not valid YAML"
        raise ConfigError(f"{key + ': ' if key else ''}{what} ({_yaml_problem(exc)})") from None
    finally:
        loader.dispose()


def parse_override(item: str) -> tuple[list[str], Any]:
    """``training.epochs=3`` -> (["training", "epochs"], 3), the value parsed as YAML; ConfigError
    naming the key for a value that is not YAML (``training.lr=[``)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r}: expected KEY.PATH=VALUE")
    key = key.strip()
    return key.split("."), load_yaml(raw, key)


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set each dotted key in a copy of ``data``; unknown keys fail later, at validation."""
    out = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(path)}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def config_from_dict(data: Any, overrides: list[str] = ()) -> PipelineConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"<root>: expected a mapping, got {type(data).__name__}")
    data = apply_overrides(data, list(overrides))
    for load in TASK_LOADERS:  # before validation starts: a schema rebuilt during it is not the one used
        load(data.get("task"))
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


# A config may start from another: ``extends: ../../configs/digits.yaml`` (relative to its own
# folder) and give only the keys it changes. Mappings merge key by key; any other value (a list,
# a number, null) replaces the base's. The recorded config is the merged one, so a run's config
# hash, reproduce and the MLflow params never depend on where a key was written.
EXTENDS_KEY = "extends"
_MAX_EXTENDS = 5


def merge_config(base: dict, child: dict) -> dict:
    """``child`` laid over ``base``: mappings merge recursively, other values replace."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def _read_config_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None


def read_config_data(path: str | Path, _chain: tuple[Path, ...] = ()) -> Any:
    """The YAML of the config at ``path`` with its ``extends`` chain merged in (not validated).
    ConfigError in one line for an unreadable file, bad YAML or a bad ``extends``."""
    path = Path(path)
    return _merged(path, _read_config_text(path), _chain)


def _merged(path: Path, text: str, _chain: tuple[Path, ...] = ()) -> Any:
    data = load_yaml(text)
    if not isinstance(data, dict) or EXTENDS_KEY not in data:
        return data
    data = dict(data)
    base = data.pop(EXTENDS_KEY)
    if not isinstance(base, str) or not base.endswith((".yaml", ".yml")) or Path(base).is_absolute():
        raise ConfigError(f"{EXTENDS_KEY}: expected the relative path of a .yaml config (from the folder of "
                          f"{path.name}), got {base!r}")
    base_path = (path.parent / base).resolve()
    chain = (*_chain, path.resolve())
    if base_path in chain:
        raise ConfigError(f"{EXTENDS_KEY}: {base} leads back to {base_path.name}: a config cannot extend itself")
    if len(chain) > _MAX_EXTENDS:
        raise ConfigError(f"{EXTENDS_KEY}: more than {_MAX_EXTENDS} configs deep at {base}")
    try:
        parent = read_config_data(base_path, chain)
    except ConfigError as exc:
        raise ConfigError(f"{EXTENDS_KEY} {base}: {exc}") from None
    if not isinstance(parent, dict):
        raise ConfigError(f"{EXTENDS_KEY} {base}: expected a mapping, got {type(parent).__name__}")
    return merge_config(parent, data)


def load_config(path: str | Path, overrides: list[str] = ()) -> PipelineConfig:
    """Read a YAML config (and the configs it ``extends``), apply ``--set`` overrides, validate.
    Raises ConfigError."""
    path = Path(path)
    text = _read_config_text(path)  # its error names the path itself; the others get it below
    try:
        data = _merged(path, text)
        cfg = config_from_dict(data, overrides)
        if overrides:  # a path from an override stays inside the repository
            from core.override_paths import check_override_paths
            from core.paths import project_root

            check_override_paths(data, apply_overrides(data, list(overrides)), cfg, project_root(path))
        return cfg
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
