"""Which samples each rank trains on, as a function of a GLOBAL SAMPLE CURSOR (not a per-rank position).

Each epoch's global order is a permutation of the N sample ids from (seed, epoch, N) alone; from
cursor c the steps consume, over all ranks, [c, c+G), [c+G, c+2G), ... So a run resumed on another
world size continues at c without skipping or repeating a sample. Every rank yields the same number
of steps and ``grad_accum`` micro-batches each (possibly empty), so no rank waits alone on a collective.
``choose_plan`` is the batch policy on resume (docs/training.md, "Resume, resize and the sample cursor").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Protocol

if TYPE_CHECKING:  # torch only where tensors are cut: the plan and the policy are plain arithmetic
    import torch


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's G samples are split over data-parallel ranks and micro-steps."""

    global_batch: int  # G: samples per optimizer step, over all data-parallel ranks and micro-steps
    micro_batch: int  # b: samples per rank per micro-step (in a full step)
    grad_accum: int  # a: micro-steps per optimizer step
    dp_size: int  # data-parallel replicas
    dp_rank: int  # this rank's index among them

    def __post_init__(self) -> None:
        for name in ("global_batch", "micro_batch", "grad_accum", "dp_size"):
            if (v := getattr(self, name)) < 1:
                raise ValueError(f"BatchPlan.{name}: must be >= 1, got {v}")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"BatchPlan.dp_rank: must be in [0, {self.dp_size}), got {self.dp_rank}")
        if self.global_batch != self.micro_batch * self.dp_size * self.grad_accum:
            raise ValueError(f"BatchPlan: global_batch {self.global_batch} != micro_batch {self.micro_batch} "
                             f"x dp_size {self.dp_size} x grad_accum {self.grad_accum}")

    @classmethod
    def of(cls, micro_batch: int, grad_accum: int, dp_size: int, dp_rank: int = 0) -> "BatchPlan":
        return cls(micro_batch * dp_size * grad_accum, micro_batch, grad_accum, dp_size, dp_rank)

    def steps(self, n: int, cursor: int = 0) -> int:
        """Optimizer steps left in an epoch of ``n`` samples from ``cursor``."""
        return math.ceil(max(n - cursor, 0) / self.global_batch)

    def describe(self) -> dict:
        """The plan as recorded in checkpoints and result.json (no rank: it is the same on every rank)."""
        return {"dp_size": self.dp_size, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "global_batch": self.global_batch}


@dataclass
class StepBatches:
    """This rank's share of one optimizer step."""

    micro: list[tuple]  # `grad_accum` micro-batches: (x, y) tensors each, possibly with 0 rows
    ids: list  # per micro-batch: a 1-D int64 tensor of the global sample ids it holds
    global_samples: int  # samples this step consumes over all ranks (G, or fewer in the last step)


class BatchSource(Protocol):
    """Anything that yields an epoch's steps from a global cursor (in-memory, DataLoader, streamed)."""

    def __len__(self) -> int:  # N: samples in one epoch
        ...

    def epoch_steps(self, epoch: int, cursor: int, plan: BatchPlan) -> Iterator[StepBatches]:
        ...


def global_order(n: int, seed: int, epoch: int) -> "torch.Tensor":
    """The epoch's global order: a permutation of ``range(n)`` from (seed, epoch) alone (its own
    generator: drawing from the global RNG, dropout's, would make a resumed run differ)."""
    import torch

    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def step_slices(order: "torch.Tensor", cursor: int, plan: BatchPlan) -> Iterator[tuple[list, int]]:
    """(this rank's ``grad_accum`` id slices, the step's global samples) for each step from ``cursor``:
    micro-step k gives rank r the step's positions ``(k * dp + r) * b ... + b`` (a short last step
    fills rank 0's micro-step 0 first; the rest get empty slices)."""
    n, g, b, dp, r = len(order), plan.global_batch, plan.micro_batch, plan.dp_size, plan.dp_rank
    if not 0 <= cursor <= n:
        raise ValueError(f"cursor {cursor} is outside the epoch's {n} samples")
    for start in range(cursor, n, g):
        step = order[start:min(start + g, n)]
        yield [step[(k * dp + r) * b:(k * dp + r + 1) * b] for k in range(plan.grad_accum)], len(step)


class InMemorySource:
    """Batches cut straight from a ``TensorDataset``'s tensors: one index op per micro-batch, no collate."""

    def __init__(self, dataset, seed: int):
        self.tensors, self.seed = dataset.tensors, seed

    def __len__(self) -> int:
        return len(self.tensors[0])

    def epoch_steps(self, epoch: int, cursor: int, plan: BatchPlan) -> Iterator[StepBatches]:
        order = global_order(len(self), self.seed, epoch)
        for micro_ids, total in step_slices(order, cursor, plan):
            yield StepBatches([tuple(t[idx] for t in self.tensors) for idx in micro_ids], micro_ids, total)


class DataLoaderSource(InMemorySource):
    """The same micro-batches through a torch ``DataLoader`` (workers, pinned memory, prefetch): its
    batch sampler is this rank's non-empty id slices; an empty micro-batch is made here (a collate cannot)."""

    def __init__(self, dataset, seed: int, loader_cfg):
        super().__init__(dataset, seed)
        self.dataset, self.cfg = dataset, loader_cfg

    def epoch_steps(self, epoch: int, cursor: int, plan: BatchPlan) -> Iterator[StepBatches]:
        import torch
        from torch.utils.data import DataLoader

        steps = list(step_slices(global_order(len(self), self.seed, epoch), cursor, plan))
        batches = [idx.tolist() for micro, _ in steps for idx in micro if len(idx)]
        # Own generator: a loader must not draw its seed from the global RNG (dropout's).
        gen = torch.Generator().manual_seed(self.seed + epoch)
        lc = self.cfg
        extra = {"prefetch_factor": lc.prefetch_factor} if lc.prefetch_factor else {}
        loaded = iter(DataLoader(self.dataset, batch_sampler=batches, generator=gen, num_workers=lc.num_workers,
                                 pin_memory=lc.pin_memory, **extra)) if batches else iter(())
        empty = tuple(t[:0] for t in self.tensors)
        for micro_ids, total in steps:
            yield StepBatches([tuple(next(loaded)) if len(idx) else empty for idx in micro_ids], micro_ids, total)


def build_source(dataset, seed: int, loader_cfg) -> BatchSource:
    """The source ``training.loader.kind`` names, over a ``TensorDataset``; a source already
    (``training.stream.StreamSource``) is used as it is."""
    if hasattr(dataset, "epoch_steps"):
        return dataset
    if loader_cfg.kind == "dataloader":
        return DataLoaderSource(dataset, seed, loader_cfg)
    return InMemorySource(dataset, seed)


# -- the batch policy on resume --------------------------------------------------------------
@dataclass(frozen=True)
class BatchChoice:
    """What ``choose_plan`` decided: the plan's (micro_batch, grad_accum), the LR, and why."""

    micro_batch: int
    grad_accum: int
    global_batch: int
    lr: float
    decision: str  # fresh | unchanged | configured | kept_global_batch | rescaled_lr
    reason: str
    changed: list[str] = field(default_factory=list)

    def record(self) -> dict:
        """result.json's ``batch_policy``."""
        return {"decision": self.decision, "global_batch": self.global_batch, "micro_batch": self.micro_batch,
                "grad_accum": self.grad_accum, "lr": self.lr, "changed": list(self.changed), "reason": self.reason}


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """The LR for ``global_batch`` given one tuned for ``base_batch`` (linear or sqrt rule)."""
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    return base_lr


def _split(global_batch: int, dp: int, prefer_micro: int, prefer_accum: int, max_micro: int) -> tuple[int, int] | None:
    """(micro, accum) with micro * dp * accum == global_batch: ``prefer_micro`` if it divides, else
    ``prefer_accum``, else the fewest micro-steps, with a micro-batch no larger than ``max_micro``.
    None when dp does not divide G."""
    if global_batch % dp:
        return None
    per_rank = global_batch // dp
    if per_rank % prefer_micro == 0:
        return prefer_micro, per_rank // prefer_micro
    accums = [prefer_accum, *range(1, per_rank + 1)]  # accum == per_rank always fits (micro 1)
    return next((per_rank // a, a) for a in accums if per_rank % a == 0 and per_rank // a <= max_micro)


def choose_plan(micro_batch: int, grad_accum: int, dp_size: int, lr: float, base_batch: int, rule: str,
                writer: dict | None) -> BatchChoice:
    """The batch policy: this run's (micro_batch, grad_accum) and LR, given the configured values and
    the checkpoint's writer (``TrainState.plan``; None on a fresh start). Keeps the writer's global
    batch where dp_size divides it (LR unchanged), else runs as configured with the LR rescaled."""
    configured_g = micro_batch * dp_size * grad_accum
    configured_lr = scaled_lr(lr, configured_g, base_batch, rule)
    if writer is None:
        return BatchChoice(micro_batch, grad_accum, configured_g, configured_lr, "fresh", "no checkpoint: as configured")
    w_micro, w_accum, w_dp, w_g = (writer[k] for k in ("micro_batch", "grad_accum", "dp_size", "global_batch"))
    w_cfg = writer.get("configured") or [w_micro, w_accum]
    if [micro_batch, grad_accum] != list(w_cfg):
        return BatchChoice(micro_batch, grad_accum, configured_g, configured_lr, "configured",
                           f"training.batch_size/grad_accum changed from {w_cfg[0]}/{w_cfg[1]} to "
                           f"{micro_batch}/{grad_accum}: as configured",
                           _changes(writer, micro_batch, grad_accum, dp_size))
    if (w_dp, w_micro, w_accum) == (dp_size, micro_batch, grad_accum):
        return BatchChoice(micro_batch, grad_accum, w_g, configured_lr, "unchanged", "same data-parallel layout")
    if w_dp == dp_size:  # the writer was itself resized: go on with its plan
        return BatchChoice(w_micro, w_accum, w_g, scaled_lr(lr, w_g, base_batch, rule), "unchanged",
                           "same data-parallel size as the writer: its plan continues")
    split = (micro_batch, grad_accum) if configured_g == w_g else _split(w_g, dp_size, w_micro, w_accum,
                                                                         max(w_micro, micro_batch))
    if split is not None:
        b, a = split
        # The writer's LR, unless a forced resume changed training.lr.
        return BatchChoice(b, a, w_g, scaled_lr(lr, w_g, base_batch, rule), "kept_global_batch",
                           f"dp_size {w_dp} -> {dp_size}: kept global batch {w_g} as {b} per rank x "
                           f"{dp_size} ranks x {a} micro-steps; lr unchanged",
                           _changes(writer, b, a, dp_size))
    return BatchChoice(micro_batch, grad_accum, configured_g, configured_lr, "rescaled_lr",
                       f"dp_size {dp_size} does not divide the global batch {w_g}: kept {micro_batch} per rank "
                       f"x {grad_accum} micro-steps (global batch {configured_g}); lr rescaled by the "
                       f"{rule!r} rule to {configured_lr:.6g}",
                       _changes(writer, micro_batch, grad_accum, dp_size) + ["lr"])


def _changes(writer: dict, micro: int, accum: int, dp: int) -> list[str]:
    return [k for k, v in BatchPlan.of(micro, accum, dp).describe().items() if writer.get(k) != v]
