"""Checkpoints behind one small API: ``maybe_save(step, state)``, ``load_state(...)``, ``prune(keep)``.

``<dir>/step_00000123/`` holds DCP files (``{"model", "optim"}``, FQN-keyed) and ``extra.pt``
(``TrainState.meta()``); it is written under a temp name, fsynced, marked ``COMPLETE`` and renamed,
so a crash or power loss never leaves one that resume would trust. Replicated state (``async_save``)
is written by rank 0 from a CPU copy in a background thread, sharded state by every rank. DCP
reshards on read: a checkpoint resumes on another world size or strategy (model-parallel shards
only into their own layout). ``check_identity`` is the one check that it may resume in a run.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from training.layouts import CheckpointMismatchError  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from training.distributed import DistContext

log = logging.getLogger("trainflow.train")

MARKER = "COMPLETE"
EXTRA_FILE = "extra.pt"
DCP_METADATA = ".metadata"


def _dist():
    """``training.distributed`` on first use: the launcher reads ``latest_identity`` without torch."""
    from training import distributed

    return distributed


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's entries to disk (a folder: its names, e.g. after a create or rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for parent, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            _fsync(Path(parent) / name)
        _fsync(Path(parent))


def _identity(extra: dict) -> dict:
    """What the completion marker records, so a launcher can check a folder without torch.load."""
    return {"config_id": extra.get("config_id"), "data_md5": extra.get("data_md5"),
            **{k: extra[k] for k in ("resume_id", "layout") if extra.get(k) is not None}}


def latest_identity(directory: Path) -> dict | None:
    """``{step, config_id, data_md5, ...}`` of the newest complete checkpoint under ``directory``."""
    for marker in sorted(Path(directory).glob(f"step_*/{MARKER}"), reverse=True):
        try:
            return json.loads(marker.read_text())
        except (OSError, ValueError):
            continue
    return None


def check_identity(found: dict, config_id: str, data_md5: str, resume_id: str | None = None,
                   where: str = "") -> None:
    """The one check that a checkpoint may resume in this run; raises CheckpointMismatchError naming
    the key. ``found``: what the checkpoint records (its marker, or the loaded state). Compares the
    resume id when both sides have one, else the config id, and the data md5; a key it lacks is not."""
    ident = ("resume_id", resume_id) if resume_id and found.get("resume_id") else ("config_id", config_id)
    for key, mine in (ident, ("data_md5", data_md5)):
        theirs = found.get(key)
        if theirs not in (None, mine):
            raise CheckpointMismatchError(
                f"{where}: its checkpoint (step {found.get('step')}) was written for {key}={theirs}, this run "
                f"has {mine}; use a fresh output folder, or --force-resume to continue from it anyway")


def _cpu_copy(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_copy(v) for v in obj)
    return obj


def _atomic_save(obj, path: Path) -> None:
    """``torch.save`` under a temporary name, then rename: a crash never leaves a half file at ``path``."""
    import torch

    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _dcp_errors(what: str, no_dist: bool = False) -> Iterator[None]:
    """Turn DCP's ``CheckpointException`` (a ``BaseException``: ``except Exception`` would miss it) into a
    ``RuntimeError``. ``no_dist``: one rank alone, DCP's warning that torch.distributed is off silenced."""
    import warnings

    from torch.distributed.checkpoint.api import CheckpointException

    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            yield
        except CheckpointException as exc:
            detail = "; ".join(f"rank {r}: {type(e[0]).__name__}: {e[0]}".rstrip(": ")
                               for r, e in sorted(exc.failures.items()))
            raise RuntimeError(f"{what} failed ({detail})") from None


def _agree(ctx: "DistContext", error: BaseException | None, what: str) -> None:
    """COLLECTIVE: raise on every rank when any rank failed ``what`` (so no rank waits alone)."""
    errors = _dist().all_gather_object(ctx, None if error is None else f"{type(error).__name__}: {error}")
    failed = {rank: msg for rank, msg in enumerate(errors) if msg is not None}
    if failed:
        detail = "; ".join(f"rank {r}: {m}" for r, m in failed.items())
        raise RuntimeError(f"{what} failed ({detail})") from error


def _state_dicts(strategy, wrapped, optimizer):
    """(model, optimizer) state dicts as the strategy holds them, FQN-keyed. ``get_state_dict``
    initialises an optimizer that never stepped (AdamW: step=1); saving must not change training."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    fresh = not optimizer.state
    try:
        return get_state_dict(strategy.checkpoint_module(wrapped), optimizer, options=strategy.state_dict_options())
    finally:
        if fresh:
            optimizer.state.clear()


def model_copy(strategy, wrapped) -> dict:
    """A copy of the model's weights as the strategy holds them (FQN-keyed; this rank's shards): the
    best epoch's weights, kept beside training and checkpointed with it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(strategy.checkpoint_module(wrapped), options=strategy.state_dict_options())
    return {k: v.detach().clone() for k, v in sd.items()}


def restore_model(strategy, wrapped, weights: dict) -> None:
    """Load ``model_copy``'s ``weights`` back into the model in place."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    set_model_state_dict(strategy.checkpoint_module(wrapped), weights, options=strategy.state_dict_options())


def _saved(model_sd: dict, optim_sd: dict, best: dict | None) -> dict:
    """What DCP writes: model and optimizer, and the best epoch's weights when there are any."""
    return {"model": model_sd, "optim": optim_sd, **({"best": best} if best is not None else {})}


def snapshot(strategy, wrapped, optimizer, extra: dict, best: dict | None = None) -> dict:
    """Rank 0 of a replicated strategy: a CPU copy of the full state, to write while training goes on."""
    model_sd, optim_sd = _state_dicts(strategy, wrapped, optimizer)
    return {"model": _cpu_copy(model_sd), "optim": _cpu_copy(optim_sd), "extra": extra,
            "best": None if best is None else _cpu_copy(best)}


def write_snapshot(state: dict, folder: Path) -> None:
    """Rank 0: write a ``snapshot`` into ``folder`` as DCP files, alone (``no_dist``)."""
    import torch.distributed.checkpoint as dcp

    folder = Path(folder)
    _atomic_save(state["extra"], folder / EXTRA_FILE)
    with _dcp_errors(f"saving checkpoint {folder}", no_dist=True):
        dcp.save(_saved(state["model"], state["optim"], state.get("best")), checkpoint_id=folder, no_dist=True)


def save_state(strategy, wrapped, optimizer, extra: dict, folder: Path, best: dict | None = None) -> None:
    """COLLECTIVE. Write model + optimizer + ``extra`` into ``folder``: a replicated strategy's rank
    0 alone, a sharded one's every rank its shards; every rank raises if any failed."""
    import torch.distributed.checkpoint as dcp

    folder, what, error = Path(folder), f"saving checkpoint {folder}", None
    if strategy.ctx.is_main:
        try:
            if strategy.async_save:
                write_snapshot(snapshot(strategy, wrapped, optimizer, extra, best), folder)
            else:
                _atomic_save(extra, folder / EXTRA_FILE)
        except Exception as exc:  # reported on every rank by _agree
            error = exc
    _agree(strategy.ctx, error, what)
    if not strategy.async_save:
        model_sd, optim_sd = _state_dicts(strategy, wrapped, optimizer)
        with _dcp_errors(what):
            dcp.save(_saved(model_sd, optim_sd, best), checkpoint_id=folder)


def _holds_best(folder: Path) -> bool:
    """Whether a checkpoint holds the best epoch's weights (DCP's metadata names its keys)."""
    from torch.distributed.checkpoint import FileSystemReader

    return any(k.startswith("best.") for k in FileSystemReader(folder).read_metadata().state_dict_metadata)


def load_state(strategy, wrapped, optimizer, folder: Path) -> dict:
    """Restore model and optimizer in place from ``folder``; returns its ``extra`` (with ``best_model``:
    the best epoch's weights, when it holds them). A replicated strategy's ranks read alone, a sharded
    one's together (COLLECTIVE: if any rank fails, every rank raises)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    folder = Path(folder)
    replicated = strategy.async_save
    extra, error = None, None
    try:
        if not (folder / DCP_METADATA).is_file():
            raise FileNotFoundError(f"{folder / DCP_METADATA}: no checkpoint metadata (an older trainflow's "
                                    "state.pt is not read)")
        extra = torch.load(folder / EXTRA_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:
        if replicated:
            raise
        error = exc
    if not replicated:
        _agree(strategy.ctx, error, f"loading checkpoint {folder}")
    strategy.check_layout(extra, folder)  # every rank read the same extra: all raise or none
    module, options = strategy.checkpoint_module(wrapped), strategy.state_dict_options()
    model_sd, optim_sd = get_state_dict(module, optimizer, options=options)  # the targets
    best = {k: v.clone() for k, v in model_sd.items()} if _holds_best(folder) else None
    state = _saved(model_sd, optim_sd, best)
    with _dcp_errors(f"loading checkpoint {folder}", no_dist=replicated):
        dcp.load(state, checkpoint_id=folder, no_dist=replicated)
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=options)
    if best is not None:
        extra["best_model"] = state["best"]
    return extra


class CheckpointManager:
    """Step folders of one run's checkpoints, and the policy of when to write one (``training.
    checkpoint_every_steps`` / ``checkpoint_every_epochs`` / ``checkpoint_budget``; ``enabled`` off:
    nothing is saved or loaded)."""

    def __init__(self, directory: Path, ctx: DistContext, strategy, keep: int | None = None,
                 every_steps: int | None = None, every_epochs: int = 1, enabled: bool = True,
                 budget: float | None = None):
        self.dir, self.ctx, self.strategy, self.keep = Path(directory), ctx, strategy, keep
        self.every_steps, self.every_epochs, self.enabled = every_steps, every_epochs, enabled
        self.budget, self._t0 = budget, time.perf_counter()
        self.stall_s = 0.0  # seconds training waited on saves
        self.write_cpu_s = 0.0  # CPU seconds of rank 0's background writes (replicated state)
        self.saves = 0
        self._pending = self._pool = None  # the background write in flight (rank 0, replicated state)
        if enabled:
            # Now, not in the first save: the import would count as that checkpoint's stall, which
            # the auto interval is sized from.
            import torch.distributed.checkpoint.state_dict  # noqa: F401

    def maybe_save(self, step: int, state, *, epoch_done: int | None = None, force: bool = False) -> float | None:
        """COLLECTIVE. Save ``state`` (a ``TrainState``, or a callable making one, only called when saving)
        when ``force`` or due: inside an epoch (``epoch_done`` None) every ``every_steps`` steps, at an
        epoch end every ``every_epochs`` epochs unless ``over_budget``. Returns the stall in seconds,
        None when nothing was saved."""
        due = (epoch_done % self.every_epochs == 0 if epoch_done is not None
               else bool(self.every_steps) and step % self.every_steps == 0)
        if not self.enabled or not (force or due) or (not force and epoch_done is not None and self.over_budget()):
            return None
        t0 = time.perf_counter()
        st = state() if callable(state) else state
        self.save(step, st.model, st.optimizer, st.meta(), best=st.best_model)
        stall = time.perf_counter() - t0
        self.stall_s += stall
        self.saves += 1
        return stall

    def over_budget(self) -> bool:
        """COLLECTIVE when ``budget`` is set: whether rank 0's saves so far (training's stalls and the
        background writes' CPU) cost more than ``budget`` of the time since this manager started. An
        epoch-end save is then skipped: on short epochs a save every epoch would cost more than the
        features it protects (a DCP write is one ``torch.save`` per state entry). The first always runs."""
        if self.budget is None:
            return False
        cost = self.stall_s + self.write_cpu_s
        mine = self.ctx.is_main and cost > self.budget * (time.perf_counter() - self._t0)
        return _dist().any_rank(self.ctx, mine)  # rank 0's view, on every rank

    def load_state(self, model, optimizer):
        """COLLECTIVE. The newest readable checkpoint as a ``TrainState`` (model and optimizer restored
        in place), or None when there is none or checkpoints are off."""
        meta = self.load_latest(model, optimizer) if self.enabled else None
        if meta is None:
            return None
        try:
            return TrainState.from_meta(meta, model, optimizer)
        except StateFormatError as exc:
            raise CheckpointMismatchError(f"{self.dir}: {exc}") from None

    def _folder(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def save(self, step: int, model, optimizer, extra: dict, best: dict | None = None) -> Path:
        """COLLECTIVE. Checkpoint ``step`` (and ``best``: the best epoch's weights, ``model_copy``);
        returns its folder, complete once ``wait()`` returns (replicated state: rank 0 copies it and
        writes in a background thread)."""
        final = self._folder(step)
        tmp = self.dir / f".tmp_{final.name}"
        if self.strategy.async_save:
            if self.ctx.is_main:
                self.wait()  # one write in flight at a time; surfaces the previous one's error
                state = snapshot(self.strategy, model, optimizer, extra, best)
                self._pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
                self._pending = self._pool.submit(self._write, step, state, tmp, final, _identity(extra))
            return final
        if self.ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        _dist().barrier(self.ctx)
        save_state(self.strategy, model, optimizer, extra, tmp, best)
        _dist().barrier(self.ctx)  # every shard is on disk before the marker says so
        if self.ctx.is_main:
            self._complete(step, tmp, final, _identity(extra))
        _dist().barrier(self.ctx)
        return final

    def _write(self, step: int, state: dict, tmp: Path, final: Path, identity: dict) -> None:
        t0 = time.thread_time()
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            write_snapshot(state, tmp)
            self._complete(step, tmp, final, identity)
        finally:
            self.write_cpu_s += time.thread_time() - t0

    def _complete(self, step: int, tmp: Path, final: Path, identity: dict) -> None:
        _fsync_tree(tmp)  # every rank's files are on disk before the marker says so
        marker = tmp / MARKER
        marker.write_text(json.dumps({"step": step, **identity}))
        _fsync(marker)
        _fsync(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        _fsync(self.dir)  # the rename itself
        if self.keep:
            self.prune(self.keep)

    def wait(self) -> None:
        """Block until the background write (if any) is on disk; re-raise its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def valid_steps(self) -> list[int]:
        """Steps with a completion marker, oldest first (this rank's view of the folder)."""
        names = [m.parent.name[5:] for m in self.dir.glob(f"step_*/{MARKER}") if m.is_file()]
        return sorted(int(n) for n in names if n.isdecimal())

    def load_latest(self, model, optimizer) -> dict | None:
        """COLLECTIVE. Restore the newest checkpoint every rank can read; return its ``extra`` (None:
        none). An unreadable one is skipped with a warning; ranks agree on each attempt."""
        self.wait()  # a write still in flight is part of "latest"
        steps = _dist().broadcast_object(self.ctx, self.valid_steps())
        for step in reversed(steps):
            folder = self._folder(step)
            extra, error = None, None
            try:
                extra = load_state(self.strategy, model, optimizer, folder)
            except CheckpointMismatchError:
                raise  # readable but written for another layout: an older one would be too
            except Exception as exc:  # noqa: BLE001 - any unreadable file means: try an older one
                error = exc
            if not _dist().any_rank(self.ctx, error is not None):
                return extra
            if error is not None:
                log.warning("rank %d: skipping unreadable checkpoint %s: %s", self.ctx.rank, folder, error)
            elif self.ctx.is_main:
                log.warning("skipping checkpoint %s: another rank could not read it", folder)
        return None

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` valid checkpoints (rank 0; others return)."""
        if not self.ctx.is_main:
            return
        for step in self.valid_steps()[:-keep]:
            shutil.rmtree(self._folder(step), ignore_errors=True)


# -- TrainState: what one checkpoint holds, defined once -------------------------------------
# No scheduler state: the LR is a function of samples consumed (``training.trainer.lr_factor``).
# Version of ``meta()``: 2 has the global sample cursor (1 held a per-rank batch position).
FORMAT = 2


class StateFormatError(ValueError):
    """A checkpoint whose metadata this version cannot resume from (e.g. written before the cursor)."""


@dataclass
class TrainState:
    """Everything a checkpoint holds; ``meta()`` is the plain part, ``model``/``optimizer`` the live one."""

    model: Any = None
    optimizer: Any = None
    step: int = 0
    epoch: int = 0
    cursor: int = 0
    # Per writer rank: [loss sum, samples] of the epoch so far (its share of the epoch's train loss).
    epoch_sums: list = field(default_factory=list)
    best: float | None = None  # early stopping's best value so far, lower is better (negated if higher)
    best_epoch: int | None = None  # the epoch (1-based) that reached ``best``
    best_model: Any = None  # its weights (``model_copy``) when kept: checkpointed beside the model
    bad_epochs: int = 0
    history: list = field(default_factory=list)  # EpochStats as dicts
    rng: list = field(default_factory=list)  # per writer rank: torch.get_rng_state()
    config_id: str | None = None
    resume_id: str | None = None
    data_md5: str | None = None
    layout: dict = field(default_factory=dict)  # training.layouts.layout_for of the writer
    plan: dict = field(default_factory=dict)  # BatchPlan.describe() + lr + configured [batch, accum]

    _META = ("step", "epoch", "cursor", "epoch_sums", "best", "bad_epochs", "history", "rng", "config_id",
             "resume_id", "data_md5", "layout", "plan")
    # Meta keys a checkpoint may lack (written before they existed), with the value they then mean.
    _META_OPTIONAL = {"best_epoch": None}

    def meta(self) -> dict:
        """The plain part, stored beside model and optimizer (weights_only-loadable); a copy, as a
        background write pickles it while training appends to the history."""
        plain = {k: copy.deepcopy(getattr(self, k)) for k in (*self._META, *self._META_OPTIONAL) if k != "rng"}
        return {"format": FORMAT, **plain, "rng": list(self.rng)}

    @classmethod
    def from_meta(cls, meta: dict, model=None, optimizer=None) -> "TrainState":
        """The state a checkpoint's ``meta`` describes (model/optimizer already loaded in place);
        StateFormatError for another format."""
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format", 1) if isinstance(meta, dict) else type(meta).__name__
            raise StateFormatError(
                f"checkpoint metadata format {got!r}, this trainflow reads format {FORMAT} (a global "
                "sample cursor); it was written by an older version: use a fresh --out")
        missing = [k for k in cls._META if k not in meta]
        if missing:
            raise StateFormatError(f"checkpoint metadata lacks {', '.join(missing)}")
        optional = {k: meta.get(k, v) for k, v in cls._META_OPTIONAL.items()}
        return cls(model=model, optimizer=optimizer, best_model=meta.get("best_model"), **optional,
                   **{k: meta[k] for k in cls._META})

    def writer(self) -> dict:
        """result.json's ``resized_from`` for a run that resumed this state on another layout."""
        return {"world_size": self.layout.get("world_size"), "strategy": self.layout.get("strategy"),
                **{k: self.plan.get(k) for k in ("dp_size", "micro_batch", "grad_accum", "global_batch")}}
