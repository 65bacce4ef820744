"""Streamed Parquet training data: a ``BatchSource`` (training/batches.py) over row groups, read on demand.

The epoch's global order comes from the row groups' sizes alone: the row groups are permuted by
(seed, epoch), cut into windows of ``window`` row groups, and each window's training rows shuffled by
(seed, epoch, window); so a cursor is all a resume needs. Inside a step the samples are sorted by
row group and rank r takes the r-th run, so a rank reads few row groups of each window; a background
thread reads ahead ``PREFETCH_ROW_GROUPS``. Validation rows are held out by a seeded hash of their
ids (``Holdout``). What a row group holds and how it is read is the task's (``Task.table_stream``).
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from core.errors import DataUnavailableError

if TYPE_CHECKING:
    from core.config import PipelineConfig
    from training.batches import BatchPlan, StepBatches
    from tasks.splits import Splits

log = logging.getLogger("trainflow.stream")

# Seeded streams of one source, kept apart: row-group order, window shuffle, held-out rows.
_GROUPS, _WINDOW, _HOLDOUT = 0x67, 0x77, 0x68
# Planned steps kept ahead at most (ids only).
MAX_STEPS_AHEAD = 4096
# Row groups read ahead of those in use: hides a read, and memory does not grow with the data.
PREFETCH_ROW_GROUPS = 2

Reader = Callable[[int], tuple[np.ndarray, np.ndarray]]


def _u64(value: int) -> int:
    return int(value) % (1 << 64)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array: a cheap, well-spread hash of each id."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@dataclass(frozen=True)
class RowGroups:
    """A Parquet dataset's row groups in reading order; row group ``u`` holds global ids
    ``start[u] .. start[u] + rows[u]``."""

    files: tuple[Path, ...]
    file_of: np.ndarray  # per row group: index into files
    group_of: np.ndarray  # per row group: its index inside its file
    rows: np.ndarray  # per row group: rows
    start: np.ndarray  # per row group: global id of its first row
    names: tuple[str, ...]  # the columns (every file has them)
    types: dict  # column -> pyarrow type (of the first file)

    def __len__(self) -> int:
        return len(self.rows)

    def ids(self, unit: int) -> np.ndarray:
        return self.start[unit] + np.arange(self.rows[unit], dtype=np.int64)


def scan_row_groups(source: Path) -> RowGroups:
    """The row groups of a Parquet file or folder, from the footers alone; DataUnavailableError names
    a file that is unreadable or lacks the first file's columns."""
    import pyarrow.parquet as pq

    from tasks.columnar import parquet_files

    files = parquet_files(Path(source))
    file_of, group_of, rows, names, types = [], [], [], None, None
    for i, path in enumerate(files):
        try:
            meta = pq.ParquetFile(path)
            schema = meta.schema_arrow
            counts = [meta.metadata.row_group(g).num_rows for g in range(meta.num_row_groups)]
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds; all mean "unreadable"
            raise DataUnavailableError(f"{path} cannot be read as parquet: {type(exc).__name__}: {exc}") from None
        if names is None:
            names, types = tuple(schema.names), {f.name: f.type for f in schema}
        elif missing := [c for c in names if c not in schema.names]:
            raise DataUnavailableError(f"{path} lacks column(s) {missing} that {files[0].name} has")
        for g, n in enumerate(counts):
            if n:
                file_of.append(i), group_of.append(g), rows.append(n)
    rows_a = np.asarray(rows, dtype=np.int64)
    return RowGroups(tuple(files), np.asarray(file_of, dtype=np.int64), np.asarray(group_of, dtype=np.int64),
                     rows_a, np.cumsum(rows_a) - rows_a, names, types)


class Holdout:
    """The rows held out for per-epoch validation: those whose seeded id hash falls below ``fraction``,
    in a seeded set of row groups of about ``max_rows / fraction`` rows (so about ``max_rows``)."""

    def __init__(self, groups: RowGroups, seed: int, fraction: float, max_rows: int):
        order = np.random.default_rng([_u64(seed), _HOLDOUT]).permutation(len(groups))
        k = int(np.searchsorted(np.cumsum(groups.rows[order]), max_rows / fraction)) + 1 if fraction else 0
        self.units = frozenset(order[:k].tolist())
        self.key = np.uint64(_mix(np.asarray([_u64(seed)], dtype=np.uint64))[0])
        self.threshold = np.uint64(min(int(fraction * 2.0**64), (1 << 64) - 1))

    def mask(self, unit: int, ids: np.ndarray) -> np.ndarray:
        if unit not in self.units:
            return np.zeros(len(ids), dtype=bool)
        return _mix(ids.astype(np.uint64) ^ self.key) < self.threshold


@dataclass
class _Planned:
    """One step of this rank, as ids: what ``epoch_steps`` turns into tensors."""

    ids: np.ndarray  # this rank's ids of the step (int64), sorted by row group; micro-batch k: [k b, k b + b)
    runs: list  # (row group, first, end) of each run of one row group in ``ids``
    global_samples: int
    window: int  # the window holding the step's first position
    units: tuple  # the row groups this rank reads for the step, in order of use


class StreamSource:
    """A ``BatchSource`` over a Parquet dataset's row groups. ``read(u)``: row group ``u``'s (features
    float32 ``[rows, f]``, targets), held-out rows too, called from one thread at a time."""

    def __init__(self, groups: RowGroups, read: Reader, *, seed: int, window: int, holdout: Holdout,
                 n_features: int, y_dtype, prefetch: bool = True):
        self.groups, self.read, self.seed, self.window = groups, read, _u64(seed), window
        self.holdout, self.prefetch = holdout, prefetch
        self._empty = (np.zeros((0, n_features), dtype=np.float32), np.zeros((0,), dtype=y_dtype))
        self._train = np.asarray([len(self.train_ids(u)) for u in range(len(groups))], dtype=np.int64)
        self._n = int(self._train.sum())
        if self._n == 0:
            raise DataUnavailableError(f"{groups.files[0] if groups.files else 'the dataset'}: no training rows")
        self._layout_cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._n

    def train_ids(self, unit: int) -> np.ndarray:
        """The global ids of ``unit``'s training rows (not held out), ascending."""
        ids = self.groups.ids(unit)
        return ids[~self.holdout.mask(unit, ids)]

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(the epoch's row-group sequence, each window's first position; one more at the end)."""
        if self._layout_cache is None or self._layout_cache[0] != epoch:
            units = np.random.default_rng([self.seed, epoch, _GROUPS]).permutation(len(self.groups))
            per_window = np.add.reduceat(self._train[units], np.arange(0, len(units), self.window))
            starts = np.concatenate([[0], np.cumsum(per_window)]).astype(np.int64)
            self._layout_cache = (epoch, units, starts)
        return self._layout_cache[1], self._layout_cache[2]

    def _window(self, epoch: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w``'s part of the global order: (ids, the sequence position of each id's row group)."""
        units, _ = self._layout(epoch)
        seq = np.arange(w * self.window, min((w + 1) * self.window, len(units)))
        parts = [self.train_ids(int(units[p])) for p in seq]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        keys = np.repeat(seq.astype(np.int32), [len(p) for p in parts])
        perm = np.random.default_rng([self.seed, epoch, w, _WINDOW]).permutation(len(ids))
        return ids[perm], keys[perm]

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's whole global order of ids (for tests: it holds all N ids)."""
        _, starts = self._layout(epoch)
        return np.concatenate([self._window(epoch, w)[0] for w in range(len(starts) - 1)])

    def _plan(self, epoch: int, cursor: int, plan: "BatchPlan") -> Iterator[_Planned]:
        """This rank's steps from ``cursor``, as ids (no data read)."""
        n, G, share = self._n, plan.global_batch, plan.micro_batch * plan.grad_accum
        if not 0 <= cursor <= n:
            raise ValueError(f"cursor {cursor} is outside the epoch's {n} samples")
        units, starts = self._layout(epoch)
        lo = plan.dp_rank * share
        windows: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for pos in range(cursor, n, G):
            g = min(G, n - pos)
            first = int(np.searchsorted(starts, pos, side="right")) - 1
            for old in [w for w in windows if w < first]:
                del windows[old]
            ids_parts, key_parts, at, w = [], [], pos, first
            while at < pos + g:  # the step's slice, across window boundaries
                if w not in windows:
                    windows[w] = self._window(epoch, w)
                take = min(pos + g, int(starts[w + 1])) - at
                off = at - int(starts[w])
                ids_parts.append(windows[w][0][off:off + take])
                key_parts.append(windows[w][1][off:off + take])
                at, w = at + take, w + 1
            ids, keys = np.concatenate(ids_parts), np.concatenate(key_parts)
            # Sorted by row group (the sequence position orders windows too): a rank's run of the
            # step touches few row groups. Stable, so equal keys keep the order's order.
            order = np.argsort(keys, kind="stable")[lo:lo + share]
            mine, mine_keys = ids[order], keys[order]
            cuts = np.flatnonzero(mine_keys[1:] != mine_keys[:-1]) + 1
            starts_, ends_ = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(mine)]])
            run_units = units[mine_keys[starts_]].tolist() if len(mine) else []
            yield _Planned(mine, list(zip(run_units, starts_.tolist(), ends_.tolist())), g, first, tuple(run_units))

    def epoch_steps(self, epoch: int, cursor: int, plan: "BatchPlan") -> Iterator["StepBatches"]:
        """This rank's steps of ``epoch`` from ``cursor``. Plans ahead (ids only) and drops a row group once
        this rank reads it no more: memory holds a share of one window plus the prefetched ones."""
        steps = self._plan(epoch, cursor, plan)
        seq, _ = self._layout(epoch)
        window_of = np.empty(len(seq), dtype=np.int64)
        window_of[seq] = np.arange(len(seq)) // self.window  # each row group's window this epoch
        ahead: deque[_Planned] = deque()
        uses: dict[int, int] = {}  # row group -> planned steps not yet yielded that read it
        seen: set = set()
        upcoming: deque = deque()  # row groups of planned steps not yet asked for, in order of first use
        asked: set = set()  # asked for, not yet used by a step
        more, planned_through = True, -1  # planned_through: the last planned step's first window
        with closing(_Loader(self.read, self.prefetch)) as loader:
            while True:
                # Plan ahead: enough to keep the reader ahead, and every step of the windows the next
                # step reads, so a row group's last use by this rank is known.
                while more and len(ahead) < MAX_STEPS_AHEAD and (
                        not ahead or len(upcoming) < PREFETCH_ROW_GROUPS
                        or planned_through <= max((int(window_of[u]) for u in ahead[0].units), default=-1)):
                    planned = next(steps, None)
                    if planned is None:
                        more = False
                        break
                    ahead.append(planned)
                    planned_through = planned.window
                    for u in planned.units:
                        uses[u] = uses.get(u, 0) + 1
                        if u not in seen:
                            seen.add(u)
                            upcoming.append(u)
                if not ahead:
                    return
                planned = ahead.popleft()
                for u in planned.units:
                    uses[u] -= 1
                # No later step needs a row group of an earlier window than this step's first.
                need = min((int(window_of[u]) for u in planned.units), default=planned.window)
                for u in [u for u in loader.loaded if window_of[u] < need]:
                    loader.drop(u)
                # A step crossing into the next window asks for that window's row groups (in _tensors)
                # only once the leaving ones are copied out and dropped: never two windows at once.
                while upcoming and upcoming[0] in planned.units:  # needed now: ask (if not yet)
                    u = upcoming.popleft()
                    if window_of[u] == need:
                        loader.want(u)
                asked.difference_update(planned.units)
                while upcoming and len(asked) < PREFETCH_ROW_GROUPS:  # read ahead in the background
                    u = upcoming.popleft()
                    loader.want(u)
                    asked.add(u)
                leaving = ({u for u in planned.units if window_of[u] == need}
                           if any(window_of[u] != need for u in planned.units) else set())
                batches = self._tensors(planned, loader, plan.micro_batch, plan.grad_accum, leaving)
                # Dropped now, not when its window ends: otherwise a rank holds the whole next window.
                for u in planned.units:
                    if uses[u] == 0 and (not more or window_of[u] < planned_through):
                        del uses[u]
                        loader.drop(u)
                yield batches

    def _tensors(self, planned: _Planned, loader: "_Loader", micro: int, accum: int,
                 leaving: set = frozenset()) -> "StepBatches":
        import torch

        from training.batches import StepBatches

        ids = planned.ids
        if not len(ids):
            x, y = self._empty
        elif len(planned.runs) == 1:  # one row group: one gather
            u, lo, hi = planned.runs[0]
            gx, gy = loader.get(u)
            rows = ids - self.groups.start[u]
            x, y = gx[rows], gy[rows]
        else:
            x = np.empty((len(ids), self._empty[0].shape[1]), dtype=np.float32)
            y = np.empty((len(ids),), dtype=self._empty[1].dtype)
            for k, (u, lo, hi) in enumerate(planned.runs):  # in window order: ``leaving``'s row groups first
                if u not in loader.loaded:  # the next window's, asked once the leaving ones are dropped
                    for v, _, _ in planned.runs[k:]:
                        loader.want(v)
                gx, gy = loader.get(u)
                rows = ids[lo:hi] - self.groups.start[u]
                x[lo:hi], y[lo:hi] = gx[rows], gy[rows]
                if u in leaving:  # no later step reads it: dropped before the next window's are read
                    del gx, gy
                    loader.drop(u)
        xt, yt, it = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(np.ascontiguousarray(ids))
        cut = [min(k * micro, len(ids)) for k in range(accum + 1)]
        return StepBatches([(xt[lo:hi], yt[lo:hi]) for lo, hi in zip(cut, cut[1:])],
                           [it[lo:hi] for lo, hi in zip(cut, cut[1:])], planned.global_samples)

    def held_out(self) -> tuple[np.ndarray, np.ndarray]:
        """(features, targets) of every held-out row: the per-epoch validation split (bounded)."""
        xs, ys = [self._empty[0]], [self._empty[1]]
        for u in sorted(self.holdout.units):
            mask = self.holdout.mask(u, self.groups.ids(u))
            if mask.any():
                gx, gy = self.read(u)
                xs.append(gx[mask])
                ys.append(gy[mask])
        return np.concatenate(xs), np.concatenate(ys)


class _Loader:
    """Row groups by index, read by one background thread in the order asked (``prefetch``) or here
    on first use; ``drop`` forgets one."""

    def __init__(self, read: Reader, prefetch: bool):
        self.read = read
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="trainflow-stream") if prefetch else None
        self.loaded: dict[int, object] = {}

    def want(self, unit: int) -> None:
        if unit not in self.loaded:
            self.loaded[unit] = self.pool.submit(self.read, unit) if self.pool else None

    def get(self, unit: int) -> tuple[np.ndarray, np.ndarray]:
        value = self.loaded.get(unit)
        if isinstance(value, Future):
            value = value.result()
        elif value is None:
            value = self.read(unit)
        self.loaded[unit] = value
        return value

    def drop(self, unit: int) -> None:
        self.loaded.pop(unit, None)

    def close(self) -> None:
        if self.pool is not None:  # a generator closed early (preemption): no read outlives it
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.loaded.clear()


def stream_splits(cfg: "PipelineConfig", root: Path, seed: int, data_md5: str) -> "Splits":
    """``Splits`` whose ``train`` is a ``StreamSource`` over the task's ``table_stream``, ``val`` the
    held-out rows and ``test`` empty (the evaluation reads the test split itself)."""
    from tasks import get_task
    from tasks.splits import Splits, tensors

    lc = cfg.training.loader
    stream = get_task(cfg.task).table_stream(cfg, root, data_md5)
    groups = scan_row_groups(stream.source)
    info, read, y_dtype = stream.open(groups)
    holdout = Holdout(groups, seed, cfg.dataset.val_fraction, lc.val_rows)
    train = StreamSource(groups, read, seed=seed, window=lc.shuffle_row_groups, holdout=holdout,
                         n_features=len(info.features), y_dtype=y_dtype)
    vx, vy = train.held_out()
    empty = tensors(np.zeros((0, len(info.features)), dtype=np.float32), np.zeros((0,), dtype=y_dtype))
    log.info("streaming %s: %d row groups, %d training rows, %d held out", stream.source, len(groups), len(train),
             len(vy))
    return Splits(train=train, val=tensors(vx, vy), test=empty, info=info)
