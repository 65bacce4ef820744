"""Image sets as WebDataset tar shards, torch-free: writing, indexing and streaming them.

A shard set is ``train/NNNNNN.tar`` and ``test/NNNNNN.tar`` under ``dataset.path`` (the folder
``dataset.images.shards`` names, ``.`` for the data folder itself). A sample is the members that share
a key (the name up to its first dot): one image (``.jpg``, ``.jpeg``, ``.png``, ``.webp``) holding the
original encoded bytes, and its class in ``.cls`` (text) or ``.json`` (``{"label": ...}`` or
``{"cls": ...}``). A sample is named ``<split>/<shard>:<member>`` in every message and report.

Tar shards rather than Parquet row groups of bytes: users already have them (WebDataset, LitData
and most vision pipelines write them), ``tar tf`` shows what is inside, and a shard is read front to
back or by a member's offset, with nothing but the standard library.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from core.errors import DataUnavailableError

if TYPE_CHECKING:
    from core.config import DatasetConfig

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
LABEL_SUFFIXES = (".cls", ".json")
# Samples per shard ``write_shards`` writes: shards of tens of MB for photos, few enough files for DVC.
SHARD_SAMPLES = 1000


@dataclass(frozen=True)
class Member:
    """One sample of a shard: its key, the image member's name, where its bytes start and how many
    there are, and its class."""

    key: str
    name: str
    offset: int
    size: int
    label: str


def shard_files(folder: Path) -> list[Path]:
    """The ``*.tar`` files of a split's folder, by name (WebDataset's ``000000.tar`` order)."""
    return sorted(p for p in Path(folder).glob("*.tar") if p.is_file() and not p.name.startswith("."))


def split_shards(cfg: "DatasetConfig", root: Path) -> dict[str, list[Path]]:
    """``{"train": [shard], "test": [shard]}`` of a shard set; DataUnavailableError when a split has none."""
    from tasks.image_data import _inside

    base = Path(root) / cfg.path
    if not base.is_dir():
        raise DataUnavailableError.not_pulled(base, cfg.dvc_file)
    top = _inside(base, cfg.images.shards, "dataset.images.shards") if cfg.images.shards != "." else base
    out = {}
    for split, folder in (("train", cfg.images.train_dir), ("test", cfg.images.test_dir)):
        found = shard_files(top / folder)
        if not found:
            raise DataUnavailableError(f"{split} split: no shards in {top / folder} (expected {folder}/000000.tar ...)")
        out[split] = found
    return out


def _label(name: str, data: bytes) -> str:
    from tasks.base import label_key

    text = data.decode("utf-8", errors="replace").strip()
    if name.endswith(".json"):
        try:
            meta = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{name}: not JSON ({exc})") from None
        value = meta.get("label", meta.get("cls")) if isinstance(meta, dict) else None
        if value is None:
            raise ValueError(f"{name}: a JSON object with 'label' or 'cls' is expected")
        return label_key(value)
    return label_key(text)


def _split_name(name: str) -> tuple[str, str]:
    """(key, suffix) of a member name: the key runs up to the first dot of the base name."""
    folder, _, base = name.rpartition("/")
    stem, dot, rest = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ("." + rest.lower() if dot else "")


def index_shard(path: Path) -> list[Member]:
    """The samples of one shard, in member order, from its headers and label members (image bytes are
    not read); DataUnavailableError naming the shard and member of a sample without image or class."""
    out, pending = [], {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, suffix = _split_name(info.name)
                entry = pending.setdefault(key, {})
                if suffix in IMAGE_SUFFIXES:
                    entry["image"] = (info.name, info.offset_data, info.size)
                elif suffix in LABEL_SUFFIXES:
                    entry["label"] = _label(info.name, tar.extractfile(info).read())
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise DataUnavailableError(f"{path.name}: cannot be read as a tar shard: {exc}") from None
    for key, entry in pending.items():
        if "image" not in entry:
            raise DataUnavailableError(f"{path.name}:{key}: no image member ({', '.join(IMAGE_SUFFIXES)})")
        if "label" not in entry:
            raise DataUnavailableError(f"{path.name}:{entry['image'][0]}: no class member (.cls or .json)")
        name, offset, size = entry["image"]
        out.append(Member(key, name, offset, size, entry["label"]))
    return out


def read_member(path: Path, member: Member) -> bytes:
    """The encoded bytes of one sample, by its offset in the shard."""
    with open(path, "rb") as fh:
        fh.seek(member.offset)
        return fh.read(member.size)


def iter_samples(shards: Iterable[Path], split: str) -> Iterator[tuple[str, bytes, str]]:
    """(``<split>/<shard>:<member>``, encoded bytes, class) of every sample, shard after shard,
    holding one sample's bytes at a time."""
    for path in shards:
        members = index_shard(path)
        with open(path, "rb") as fh:
            for m in members:
                fh.seek(m.offset)
                yield f"{split}/{path.name}:{m.name}", fh.read(m.size), m.label


def write_shards(base: Path, entries: list[tuple[str, str]], out: Path, per_shard: int = SHARD_SAMPLES) -> list[Path]:
    """The files ``entries`` (``(path relative to base, class)``) as tar shards ``out/000000.tar`` ...,
    ``per_shard`` samples each, the original bytes unchanged beside a ``.cls`` member: one pass, one file's
    bytes in memory at a time. Each shard is written to a temporary name and renamed."""
    import os

    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for start in range(0, len(entries), per_shard):
        path = out / f"{len(written):06d}.tar"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i, (rel, label) in enumerate(entries[start:start + per_shard], start):
                key = f"{i:08d}"
                suffix = Path(rel).suffix.lower()
                for name, data in ((key + suffix, (base / rel).read_bytes()), (key + ".cls", label.encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(data), 0, 0o644  # no time: same files, same md5
                    tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, path)
        written.append(path)
    return written


class ShardIndex:
    """Global sample ids over a split's shards: shard ``u`` holds ids ``start[u] .. start[u] + rows[u]``;
    each shard's members are indexed on first use and the last 8 kept."""

    def __init__(self, shards: list[Path]):
        self.shards = list(shards)
        self.rows = np.asarray([len(index_shard(p)) for p in self.shards], dtype=np.int64)
        self.start = np.cumsum(self.rows) - self.rows
        self._members = {}

    def __len__(self) -> int:
        return int(self.rows.sum())

    def members(self, unit: int) -> list[Member]:
        if unit not in self._members:
            if len(self._members) >= 8:
                self._members.pop(next(iter(self._members)))
            self._members[unit] = index_shard(self.shards[unit])
        return self._members[unit]

    def locate(self, gid: int) -> tuple[int, Member]:
        unit = int(np.searchsorted(self.start, gid, side="right")) - 1
        return unit, self.members(unit)[gid - int(self.start[unit])]

    def read(self, gid: int) -> tuple[bytes, str, str]:
        """(encoded bytes, class, ``<shard>:<member>``) of sample ``gid``."""
        unit, m = self.locate(gid)
        return read_member(self.shards[unit], m), m.label, f"{self.shards[unit].name}:{m.name}"
