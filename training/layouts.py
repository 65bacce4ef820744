"""What a launch needs to know about the world, without torch (the pipeline process launches
but never trains): strategy names and world-size checks, checkpoint layouts, whether a GPU could be."""

from __future__ import annotations

import os

from core.config import MODEL_PARALLEL, ParallelConfig, check_parallel
from core.errors import ConfigError

# Device nodes a CUDA (or ROCm, or WSL's CUDA) GPU shows up as: with none, torch finds no GPU either.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/dev/kfd")
STRATEGIES = ("single", "ddp", "fsdp", "tp", "pp", "hybrid")
PRECISIONS = ("fp32", "bf16")


def maybe_gpu() -> bool:
    """False only when this host surely has no GPU torch could use (no device node for one)."""
    return any(os.path.exists(p) for p in GPU_DEVICE_NODES)


def choose_backend(requested: str = "auto") -> str:
    """``nccl`` when CUDA is present, else ``gloo``; an explicit choice is kept."""
    if requested != "auto":
        return requested
    if not maybe_gpu():
        return "gloo"
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


class StrategyConfigError(ConfigError, ValueError):
    """A strategy that cannot run with this world size or precision: a ``ConfigError`` for the
    CLI, and the ``ValueError`` ``build_strategy`` promises."""


class CheckpointMismatchError(RuntimeError):
    """The checkpoint was written for another config, dataset or layout."""


def check_world(strategy: str, world_size: int, parallel=None) -> None:
    """The up-front check of ``training.strategy`` (and ``training.parallel``, a
    ``core.config.ParallelConfig``, for tp/pp/hybrid) against the world size."""
    if strategy not in STRATEGIES:
        raise StrategyConfigError(
            f"training.strategy: must be one of {', '.join(repr(s) for s in STRATEGIES)}, got {strategy!r}")
    if world_size < 1:
        raise StrategyConfigError(f"training.strategy: world size must be >= 1, got {world_size}")
    if strategy == "single" and world_size > 1:
        raise StrategyConfigError(
            f"training.strategy: 'single' runs one process, but the world size is {world_size}; "
            "use 'ddp' or 'fsdp', or launch one worker")
    if strategy in MODEL_PARALLEL:
        try:
            check_parallel(strategy, parallel or ParallelConfig(), world_size)
        except ValueError as exc:
            raise StrategyConfigError(str(exc)) from None


def layout_for(strategy: str, world_size: int, parallel=None) -> dict:
    """How a run lays the model out over ranks (recorded in checkpoints; compared on resume)."""
    if strategy not in MODEL_PARALLEL:
        return {"strategy": strategy, "world_size": world_size}
    tp, pp = (parallel.tp, parallel.pp) if parallel is not None else (1, 1)
    return {"strategy": strategy, "world_size": world_size, "dp": world_size // (tp * pp), "tp": tp, "pp": pp}


def describe_layout(layout) -> str:
    if not isinstance(layout, dict):
        return "an unknown layout"
    text = f"strategy {layout.get('strategy')!r}, world size {layout.get('world_size')}"
    if "tp" in layout:
        text += f", dp {layout.get('dp')} x tp {layout.get('tp')} x pp {layout.get('pp')}"
    return text


def mismatch_error(folder, theirs, mine: dict) -> CheckpointMismatchError | None:
    """The ``CheckpointMismatchError`` for a checkpoint laid out as ``theirs`` that cannot load into
    ``mine``, naming what a launch must say to recreate ``theirs``; None when it can: replicated and
    FSDP checkpoints load at any world size, tp / pp / hybrid only into their own layout."""
    theirs_strategy = theirs.get("strategy") if isinstance(theirs, dict) else None
    if theirs == mine or not {mine["strategy"], theirs_strategy} & set(MODEL_PARALLEL):
        return None
    if not isinstance(theirs, dict):
        needed = "the layout that wrote it"
    else:
        needed = f"{theirs.get('world_size')} worker(s) (--nproc) with training.strategy={theirs.get('strategy')}"
        if "tp" in theirs:
            needed += f", training.parallel.tp={theirs.get('tp')}, training.parallel.pp={theirs.get('pp')}"
    return CheckpointMismatchError(
        f"checkpoint {folder} was written with {describe_layout(theirs)}; this run has {describe_layout(mine)}. "
        "Tensor-parallel and pipeline shards load only into the layout that wrote them (resharding them is "
        f"not supported; data-parallel ddp/fsdp checkpoints resume on any world size): resume with "
        f"{needed}, or use a fresh --out")
