"""The image task's sharded path (``dataset.images.shards``): the train split as samples the engine
streams (``training/image_stream.py`` orders them; DataLoader workers decode and augment them), the
held-out and test splits decoded with the evaluation transform.

The held-out rows: a seeded choice of ``min(val_fraction * N, training.loader.val_rows, VAL_IMAGES_MAX)``
train ids, so their memory is bounded whatever the set's size.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.errors import DataUnavailableError
from tasks.image_shards import ShardIndex, iter_samples, split_shards
from tasks.image_transforms import eval_pixels, train_pixels

if TYPE_CHECKING:
    from core.config import PipelineConfig

_HOLDOUT = 0x68
# Held-out images at most, whatever training.loader.val_rows says: their decoded pixels stay in memory
# (4,096 at 224 x 224 RGB is about 0.6 GB).
VAL_IMAGES_MAX = 4096


class ShardSamples:
    """The train split's samples for the engine: ``shard_rows`` (samples per shard, the stream's units),
    ``held`` (ids held out for validation, ascending) and ``sample((epoch, id))`` -> (uint8 pixels
    ``[c, h, w]``, class index) through the training transform. Picklable: each DataLoader worker has a copy."""

    def __init__(self, index: ShardIndex, held: np.ndarray, classes: list[str], size: tuple[int, int],
                 channels: int, augment, seed: int, workers: int):
        self.index, self.held = index, held
        self.shard_rows = index.rows
        self.shard_files = tuple(index.shards)
        self.classes = {c: i for i, c in enumerate(classes)}
        self.size, self.channels, self.augment, self.seed, self.workers = tuple(size), channels, augment, seed, workers

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: tuple[int, int]) -> tuple[np.ndarray, int]:
        epoch, gid = key
        data, label, name = self.index.read(int(gid))
        if label not in self.classes:
            raise DataUnavailableError(f"{name}: class {label!r} is not in dataset.images.classes")
        x = train_pixels(data, self.size, self.channels, self.augment, self.seed, int(epoch), int(gid), name)
        return x, self.classes[label]


def default_workers(cfg: "PipelineConfig") -> int:
    """``dataset.images.workers``, or the CPUs this rank may use (its share of the host's) less one, at least one."""
    import os

    if cfg.dataset.images.workers is not None:
        return cfg.dataset.images.workers
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    per_rank = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, per_rank - 1)


def held_ids(n: int, seed: int, fraction: float, max_rows: int) -> np.ndarray:
    k = min(int(round(fraction * n)), max_rows, max(n - 1, 0))
    return np.sort(np.random.default_rng([seed % 2**64, _HOLDOUT]).choice(n, size=k, replace=False)).astype(np.int64)


def _evaluated(data: bytes, label: str, name: str, classes: dict, images) -> tuple[np.ndarray, int]:
    """(one sample's pixels through the evaluation transform, its class index); DataUnavailableError naming it."""
    if label not in classes:
        raise DataUnavailableError(f"{name}: class {label!r} is not in dataset.images.classes {images.classes}")
    try:
        return eval_pixels(data, tuple(images.size), images.channels, name), classes[label]
    except ValueError as exc:
        raise DataUnavailableError(f"{name}: {exc}") from None


def _decode(index: ShardIndex, ids: np.ndarray, cfg: "PipelineConfig") -> tuple[np.ndarray, np.ndarray]:
    images = cfg.dataset.images
    classes = {c: i for i, c in enumerate(images.classes)}
    x = np.empty((len(ids), images.channels, *images.size), dtype=np.uint8)
    y = np.empty(len(ids), dtype=np.int64)
    for i, gid in enumerate(ids):
        data, label, name = index.read(int(gid))
        x[i], y[i] = _evaluated(data, label, f"train/{name}", classes, images)
    return x, y


def train_split(cfg: "PipelineConfig", root: Path, seed: int) -> tuple[ShardSamples, np.ndarray, np.ndarray]:
    """(the train samples, the held-out pixels and class indices)."""
    index = ShardIndex(split_shards(cfg.dataset, root)["train"])
    lc = cfg.training.loader
    held = held_ids(len(index), seed, cfg.dataset.val_fraction, min(lc.val_rows, VAL_IMAGES_MAX))
    vx, vy = _decode(index, held, cfg)
    images = cfg.dataset.images
    samples = ShardSamples(index, held, list(images.classes), tuple(images.size), images.channels, images.augment,
                           seed, default_workers(cfg))
    return samples, vx, vy


def split_pixels(cfg: "PipelineConfig", root: Path, split: str, home: Path) -> tuple[np.ndarray, np.ndarray, list]:
    """(uint8 ``[n, c, h, w]`` through the evaluation transform, class indices, sample names) of a
    whole split, memory-mapped from a ``.npy`` cache keyed by the shards' size and mtime. The cache is
    filled as the shards stream, one decoded image in memory at a time (the count comes from the
    shards' headers first), and mapped copy-on-write: a tensor over it needs no copy."""
    import json
    import os
    import tempfile

    from core.hashing import sha256_json
    from tasks.base import cache_write

    images = cfg.dataset.images
    shards = split_shards(cfg.dataset, root)[split]
    key = sha256_json({"shards": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in shards],
                       "size": list(images.size), "channels": images.channels, "classes": list(images.classes),
                       "transform": "centre_crop", "v": 1})[:32]
    folder = Path(home) / "cache" / "image-shards"
    px, meta = folder / f"{split}-{key}.npy", folder / f"{split}-{key}.json"
    try:
        x, info = np.load(px, mmap_mode="c", allow_pickle=False), json.loads(meta.read_text())
        return x, np.asarray(info["y"], dtype=np.int64), info["names"]
    except (OSError, ValueError, KeyError):
        pass
    shape = (len(ShardIndex(shards)), images.channels, *images.size)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = px.with_name(f"{px.name}.{os.getpid()}.tmp")
        x = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
    except OSError:  # a read-only home: a temporary file, unlinked once mapped
        fd, name = tempfile.mkstemp(suffix=".npy")
        os.close(fd)
        px = tmp = Path(name)
        x = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
    classes = {c: i for i, c in enumerate(images.classes)}
    ys, names = [], []
    try:
        for i, (name, data, label) in enumerate(iter_samples(shards, split)):
            x[i], k = _evaluated(data, label, name, classes, images)
            ys.append(k)
            names.append(name)
        x.flush()
        os.replace(tmp, px)
        x = np.load(px, mmap_mode="c", allow_pickle=False)
    finally:
        tmp.unlink(missing_ok=True)  # written and renamed, mapped from a temporary file, or left half-written
    text = json.dumps({"y": ys, "names": names}).encode()
    cache_write(meta, lambda fh: fh.write(text))
    return x, np.asarray(ys, dtype=np.int64), names


class FloatPixels:
    """uint8 pixels ``[n, c, h, w]`` (a memory map) read as the program's float32 input a slice at a time:
    what the evaluation hands the program, with no float copy of the whole split."""

    def __init__(self, x: np.ndarray):
        self.x = x
        self.shape = x.shape

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i) -> np.ndarray:
        return np.asarray(self.x[i], dtype=np.float32)


def read_sample(cfg: "PipelineConfig", root: Path, name: str) -> bytes:
    """The encoded bytes of the sample ``<split>/<shard>:<member>``."""
    from tasks.image_shards import index_shard, read_member

    split, _, rest = name.partition("/")
    shard, _, member = rest.partition(":")
    path = next(p for p in split_shards(cfg.dataset, root)[split] if p.name == shard)
    return read_member(path, next(m for m in index_shard(path) if m.name == member))


def profile_shards(dataset, root: Path) -> dict:
    """``{"train": profile, "test": profile}`` of a shard set (``tasks.image_data.profile``'s columns), read
    as a stream: one sample's bytes at a time; ``path`` names each sample by shard and member."""
    from tasks.image_data import profile_frame, profile_row

    shards = split_shards(dataset, root)
    return {s: profile_frame([profile_row(i, name, label, data)
                              for i, (name, data, label) in enumerate(iter_samples(shards[s], s))])
            for s in ("train", "test")}
