"""The run manifest: everything needed to repeat a run, recorded before training, logged to the
MLflow run and set as tags on the registered model version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from core.errors import DataUnavailableError
from core.hashing import sha256_json

LOCAL_IMAGE = "local"


@dataclass(frozen=True)
class DataRef:
    dvc_path: str
    md5: str
    rev: str


@dataclass(frozen=True)
class ImageRef:
    ref: str = LOCAL_IMAGE
    digest: str = LOCAL_IMAGE


@dataclass(frozen=True)
class World:
    nnodes: int
    nproc_per_node: int
    backend: str

    @property
    def size(self) -> int:
        return self.nnodes * self.nproc_per_node


@dataclass(frozen=True)
class Manifest:
    git_sha: str
    git_dirty: bool
    config_name: str
    config_sha256: str
    data: DataRef
    image: ImageRef
    packages_sha256: str
    seed: int
    world: World
    extra: dict = field(default_factory=dict)
    # The pretrained model folder a text task fine-tunes (``pretrained.dvc_file``): data like the dataset.
    pretrained: DataRef | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def tags(self) -> dict[str, str]:
        """Flat string tags for an MLflow model version / run."""
        data, image, world, p = self.data, self.image, self.world, self.pretrained
        return {"git_sha": self.git_sha, "git_dirty": str(self.git_dirty).lower(), "config_name": self.config_name,
                "config_sha256": self.config_sha256, "data_dvc_path": data.dvc_path, "data_md5": data.md5,
                "data_rev": data.rev, "image_ref": image.ref, "image_digest": image.digest,
                "packages_sha256": self.packages_sha256, "seed": str(self.seed), "world_size": str(world.size),
                "nnodes": str(world.nnodes), "nproc_per_node": str(world.nproc_per_node), "backend": world.backend,
                **({} if p is None else {"pretrained_dvc_path": p.dvc_path, "pretrained_md5": p.md5,
                                         "pretrained_rev": p.rev})}

    @property
    def inputs_md5(self) -> str:
        """What a training folder and its checkpoints are of: the data's md5, and the model folder's
        where one is fine-tuned (a changed folder never resumes a checkpoint of the old one)."""
        return self.data.md5 if self.pretrained is None else f"{self.data.md5}+{self.pretrained.md5}"


def _git(root: Path, *args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_state(root: Path) -> tuple[str, bool]:
    """(HEAD sha or "unknown", dirty flag). Untracked files do not count as dirty."""
    return _git(root, "rev-parse", "HEAD") or "unknown", bool(_git(root, "status", "--porcelain",
                                                                     "--untracked-files=no"))


def read_dvc_file(root: Path, dvc_file: str) -> DataRef:
    """The data version from a ``.dvc`` file: its first output's md5 and the git rev that last changed it."""
    try:
        out = yaml.safe_load((root / dvc_file).read_text())["outs"][0]
        md5 = out["md5"]
    except OSError:
        raise DataUnavailableError(f"{dvc_file}: not found under {root}") from None
    except (KeyError, IndexError, TypeError, yaml.YAMLError):
        raise DataUnavailableError(f"{dvc_file}: not a DVC file with an output md5") from None
    rev = _git(root, "log", "-n", "1", "--format=%H", "--", dvc_file) or "uncommitted"
    return DataRef(dvc_path=out.get("path", ""), md5=md5, rev=rev)


# packages_hash's answers in this process, by the key of the import path's folders.
_PACKAGES_MEMO: dict[str, str] = {}


def packages_hash(cache_dir: Path | None = None) -> str:
    """sha256 over the sorted ``name==version`` of every installed distribution.

    Kept (reading every distribution's metadata is slow), keyed on the import path's folders and
    their modification times (an install or removal adds or removes a ``*.dist-info`` entry, which
    changes its folder's mtime): in this process, and with ``cache_dir`` in a file there.
    """
    stamps = []
    for entry in sys.path:
        try:
            stamps.append([entry, os.stat(entry or ".").st_mtime_ns])
        except OSError:
            continue
    key = sha256_json(stamps)
    cached = cache_dir / "packages_sha256.json" if cache_dir is not None else None
    digest, file_key = _PACKAGES_MEMO.get(key), None
    if cached is not None:
        try:
            found = json.loads(cached.read_text())
            file_key = found.get("key")
            if digest is None and file_key == key:
                digest = found["sha256"]
        except (OSError, ValueError, AttributeError, KeyError):
            pass
    if digest is None:
        from importlib.metadata import distributions

        digest = sha256_json(sorted({f"{(d.metadata['Name'] or '').lower()}=={d.version}" for d in distributions()}))
    _PACKAGES_MEMO[key] = digest
    if cached is not None and file_key != key:
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = cache_dir / f"packages_sha256.json.{os.getpid()}"
            tmp.write_text(json.dumps({"key": key, "sha256": digest}))
            tmp.replace(cached)
        except OSError:
            pass  # a cache that cannot be written is only slower
    return digest


def image_from_env(ref: str | None = None, digest: str | None = None) -> ImageRef:
    """The image this run executes in: explicit values, else TRAINFLOW_IMAGE[_DIGEST], else ``local``."""
    ref = ref or os.environ.get("TRAINFLOW_IMAGE") or LOCAL_IMAGE
    # A ref pinned by digest carries it: repo/name@sha256:...
    digest = digest or os.environ.get("TRAINFLOW_IMAGE_DIGEST") or (ref.split("@", 1)[1] if "@" in ref else LOCAL_IMAGE)
    return ImageRef(ref=ref, digest=digest)


def build_manifest(root: Path, config_name: str, config_sha256: str, dvc_file: str, seed: int, world: World,
                   image: ImageRef, cache_dir: Path | None = None, pretrained_dvc_file: str | None = None) -> Manifest:
    """What this run is made of. ``cache_dir``: where ``packages_hash`` may keep its result;
    ``pretrained_dvc_file``: the model folder's DVC file, when the task fine-tunes one."""
    sha, dirty = git_state(root)
    return Manifest(git_sha=sha, git_dirty=dirty, config_name=config_name, config_sha256=config_sha256,
                    data=read_dvc_file(root, dvc_file), image=image, packages_sha256=packages_hash(cache_dir),
                    seed=seed, world=world,
                    pretrained=read_dvc_file(root, pretrained_dvc_file) if pretrained_dvc_file else None)


def flat(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A manifest's JSON form (``Manifest.to_dict``, a run's ``manifest.json``) with its sections'
    fields as ``<section>_<field>``: ``data_md5``, ``image_digest``, the names of ``Manifest.tags``."""
    return {f"{k}_{sub}" if isinstance(v, Mapping) else k: w
            for k, v in recorded.items() for sub, w in (v.items() if isinstance(v, Mapping) else [(None, v)])}


def manifest_diff(recorded: Mapping[str, Any], current: Mapping[str, Any], keys: Iterable[str]) -> dict[str, tuple]:
    """``{key: (recorded, current)}`` for each of ``keys`` whose value differs between what a run
    recorded (a model version's tags, or ``flat`` of its manifest) and what holds here now; a key
    either side lacks counts as None."""
    return {k: (recorded.get(k), current.get(k)) for k in keys if recorded.get(k) != current.get(k)}
