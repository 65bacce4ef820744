"""Training folders a run holds exclusively: one per (config, data, world), under ``<home>/train``.

A run resumes an interrupted job of the same inputs, or starts fresh; a concurrent run takes the
next free slot (``<key>.1``, ...). The lock, a ``flock`` on ``<slot>.lock``, is inherited by the
torchrun job (``start_job(lock_fd=...)``), so it is free only once both have exited.
"""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path
from typing import Iterator

from core.hashing import sha256_json
from core.locks import release, try_lock
from core.paths import under_home

log = logging.getLogger("trainflow.train")


def slot_base(home: Path, cfg_name: str, config_id: str, data_md5: str, nproc: int) -> Path:
    """The first slot of the inputs ``(config, data, workers per node)``; ConfigError when
    ``cfg_name`` would put it outside ``home`` (a slot is written and cleared with rmtree)."""
    key = sha256_json([config_id, data_md5, nproc])[:16]
    return under_home(home, "train", f"{cfg_name}-{key}")


def _slots(base: Path) -> Iterator[Path]:
    return (base if i == 0 else base.with_name(f"{base.name}.{i}") for i in itertools.count())


def _lock(folder: Path) -> int | None:
    return try_lock(folder.with_name(folder.name + ".lock"))


def completed(folder: Path) -> bool:
    """``folder`` holds a completed ``result.json`` (rank 0 writes it aside, then renames it)."""
    try:
        return json.loads((folder / "result.json").read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def resumable(folder: Path) -> bool:
    """The folder holds checkpoints of a job that did not complete."""
    return not completed(folder) and any((folder / "checkpoints").glob("step_*"))


def claim_train_dir(home: Path, cfg_name: str, config_id: str, data_md5: str, nproc: int,
                    logger: logging.Logger | logging.LoggerAdapter | None = None) -> tuple[Path, int]:
    """A training folder this process holds exclusively: ``(folder, lock fd)``; ``release`` the fd after."""
    logger = logger or log
    base = slot_base(home, cfg_name, config_id, data_md5, nproc)
    claimed: list[tuple[Path, int]] = []
    fd = None
    try:
        for folder in _slots(base):
            if claimed and not folder.exists():
                break  # past the last slot ever used, holding a free one already
            if (lock := _lock(folder)) is None:
                continue
            claimed.append((folder, lock))
            if resumable(folder) or not folder.exists():
                break  # a free slot to resume, or the first never-used one: look no further
        # Keep the slot with an interrupted job if there is one, else the first free slot.
        folder, fd = next((c for c in claimed if resumable(c[0])), claimed[0])
    finally:
        for _, other_fd in claimed:
            if other_fd != fd:
                release(other_fd)
    if completed(folder):
        shutil.rmtree(folder)
    elif (folder / "checkpoints").is_dir():
        logger.warning("resuming an interrupted training job from %s", folder / "checkpoints")
    if folder != base:
        logger.info("training folder %s is in use by another run; this run trains in %s", base.name, folder.name)
    return folder, fd


def unclaimed_resumable(home: Path, cfg_name: str, config_id: str, data_md5: str, nproc: int) -> list[Path]:
    """The slots of these inputs that hold an interrupted job no process holds now, in slot
    order: the folder ``claim_train_dir`` would pick next, looked at without claiming it."""
    found = []
    for folder in itertools.takewhile(Path.exists, _slots(slot_base(home, cfg_name, config_id, data_md5, nproc))):
        if resumable(folder) and (fd := _lock(folder)) is not None:
            release(fd)
            found.append(folder)
    return found
