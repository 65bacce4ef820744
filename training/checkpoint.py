"""Checkpoints behind one small API: ``save(step, state)``, ``load_latest()``, ``prune(keep)``.

Layout: ``<dir>/step_00000123/{state.pt,COMPLETE}``. A folder is written under a
temp name and renamed, and is valid only with its completion marker, so a crash
mid-write never leaves a checkpoint that resume would trust. Rank 0 writes;
every rank reads.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
STATE = "state.pt"


class CheckpointMismatchError(RuntimeError):
    """The checkpoint was written for another config or dataset."""


class CheckpointManager:
    def __init__(self, directory: Path, is_writer: bool):
        self.dir = Path(directory)
        self.is_writer = is_writer

    def _folder(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def save(self, step: int, state: dict) -> Path | None:
        """Write ``state`` atomically (writer rank only); returns the folder, None on other ranks."""
        if not self.is_writer:
            return None
        final = self._folder(step)
        tmp = self.dir / f".tmp_{final.name}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save(state, tmp / STATE)
        (tmp / MARKER).write_text(str(step))
        with open(tmp / MARKER) as fh:  # flush the marker before the rename makes it visible
            os.fsync(fh.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

    def valid_steps(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        steps = []
        for p in self.dir.glob("step_*"):
            if (p / MARKER).is_file() and (p / STATE).is_file():
                try:
                    steps.append(int(p.name.split("_", 1)[1]))
                except ValueError:
                    continue
        return sorted(steps)

    def load_latest(self) -> dict | None:
        """The newest checkpoint that loads; corrupt ones are skipped with a warning."""
        for step in reversed(self.valid_steps()):
            path = self._folder(step) / STATE
            try:
                return torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # a truncated or corrupt file: fall back to an older one
                log.warning("skipping unreadable checkpoint %s: %s", path, exc)
        return None

    def prune(self, keep: int) -> None:
        """Delete all but the newest ``keep`` valid checkpoints (writer rank only)."""
        if not self.is_writer:
            return
        for step in self.valid_steps()[:-keep]:
            shutil.rmtree(self._folder(step), ignore_errors=True)
