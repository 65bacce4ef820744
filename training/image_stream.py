"""A sharded image set streamed by the engine: ``training/stream.py``'s order, DataLoader workers decoding.

The shards are the stream's units (row groups for tables): each epoch permutes them by (seed, epoch),
cuts them into windows of ``training.loader.shuffle_row_groups`` shards and shuffles each window's
samples (the bounded shuffle buffer), so the epoch's global order, and a rank's share of each step,
follow from the shards' sample counts and the cursor alone. A resume (on any world size) continues at
the cursor: each sample once per epoch over all ranks. The samples' pixels come from the task
(``tasks/image_sharded.py``): read, decoded and augmented in this rank's DataLoader worker processes,
each draw a function of (seed, epoch, sample id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np

from training.stream import Holdout, RowGroups, StreamSource

if TYPE_CHECKING:
    from training.batches import BatchPlan, StepBatches


def _collate(items: list) -> tuple:
    """A micro-batch's (uint8 pixels, class indices) stacked by numpy: torch's stack of small tensors, in
    a process whose intra-op threads compete for the cores, costs more than decoding them."""
    import torch

    return (torch.from_numpy(np.stack([x for x, _ in items])),
            torch.from_numpy(np.asarray([y for _, y in items], dtype=np.int64)))


def _unread(unit: int):
    raise AssertionError("a sharded image set is read by its DataLoader workers, not by row group")


class ShardStreamSource(StreamSource):
    """A ``BatchSource`` over a task's sharded samples (``shard_rows``, ``held``, ``[(epoch, id)]``,
    ``workers``, ``size``, ``channels``)."""

    def __init__(self, samples, seed: int, window: int):
        rows = np.asarray(samples.shard_rows, dtype=np.int64)
        n = len(rows)
        groups = RowGroups(tuple(samples.shard_files), np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                           rows, np.cumsum(rows) - rows, (), {})
        self.samples, self._held = samples, np.asarray(samples.held, dtype=np.int64)
        super().__init__(groups, _unread, seed=seed, window=window, holdout=Holdout(groups, seed, 0.0, 1),
                         n_features=0, y_dtype=np.int64, prefetch=False)

    def train_ids(self, unit: int) -> np.ndarray:
        ids = self.groups.ids(unit)
        return ids[~np.isin(ids, self._held)]

    def epoch_steps(self, epoch: int, cursor: int, plan: "BatchPlan") -> Iterator["StepBatches"]:
        import torch
        from torch.utils.data import DataLoader

        from training.batches import StepBatches

        b, accum = plan.micro_batch, plan.grad_accum

        def batches():  # this rank's non-empty micro-batches, planned lazily (ids only)
            for planned in self._plan(epoch, cursor, plan):
                for k in range(accum):
                    part = planned.ids[k * b:(k + 1) * b]
                    if len(part):
                        yield [(epoch, int(i)) for i in part]

        workers = self.samples.workers
        extra = {"prefetch_factor": 2} if workers else {}
        # Own generator: a loader must not draw its seed from the global RNG (dropout's); the transforms
        # draw from (seed, epoch, id) whatever worker runs them.
        loaded = iter(DataLoader(self.samples, batch_sampler=batches(), num_workers=workers, collate_fn=_collate,
                                 pin_memory=torch.cuda.is_available(),
                                 generator=torch.Generator().manual_seed(int(self.seed) % 2**63 + epoch), **extra))
        empty = (torch.zeros((0, self.samples.channels, *self.samples.size), dtype=torch.uint8),
                 torch.zeros((0,), dtype=torch.int64))
        try:
            for planned in self._plan(epoch, cursor, plan):
                micro, ids = [], []
                for k in range(accum):
                    part = planned.ids[k * b:(k + 1) * b]
                    micro.append(tuple(next(loaded)) if len(part) else empty)
                    ids.append(torch.from_numpy(np.ascontiguousarray(part)))
                yield StepBatches(micro, ids, planned.global_samples)
        finally:
            del loaded  # a generator closed early (preemption): its workers end with it
