"""Fault injection for tests and drills: ``TRAINFLOW_FAULT=<kind>@step=N[,rank=R]``; and
``TRAINFLOW_RECORD_IDS=<folder>``, which makes each rank record the sample ids it trained on.

Kinds: ``kill``, ``raise``, ``hang``, ``sigterm`` (fire once) and ``slow@step=N,rank=R,ms=M``
(from step N on, sleep M ms after every step: a straggler). Faults fire on the first attempt only.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "TRAINFLOW_FAULT"
IDS_ENV = "TRAINFLOW_RECORD_IDS"
KINDS = ("kill", "raise", "hang", "sigterm", "slow")
SLOW_MS = 50.0


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` fault."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None
    ms: float = SLOW_MS  # slow only: the sleep per step

    def due(self, step: int, rank: int) -> bool:
        hit = step >= self.step if self.kind == "slow" else step == self.step
        return hit and self.rank in (None, rank)

    def fire(self, rank: int) -> None:
        if self.kind in ("kill", "sigterm"):
            os.kill(os.getpid(), signal.SIGKILL if self.kind == "kill" else signal.SIGTERM)
        elif self.kind == "raise":
            raise InjectedFault(f"injected fault on rank {rank} at step {self.step}")
        elif self.kind == "slow":
            time.sleep(self.ms / 1e3)
        elif self.kind == "hang":
            while True:
                time.sleep(3600)


def parse(spec: str) -> Fault:
    """``kill@step=30,rank=1`` -> Fault("kill", 30, 1); ``slow@step=5,rank=1,ms=20`` ->
    Fault("slow", 5, 1, 20.0). Raises ValueError on a bad spec."""
    kind, _, rest = spec.partition("@")
    if kind not in KINDS:
        raise ValueError(f"{ENV}: kind must be one of {KINDS}, got {kind!r}")
    allowed = {"step", "rank", "ms"} if kind == "slow" else {"step", "rank"}
    try:
        fields = dict(part.split("=", 1) for part in rest.split(",") if part)
    except ValueError:
        fields = {}
    if "step" not in fields or set(fields) - allowed:
        extra = "[,ms=M]" if kind == "slow" else ""
        raise ValueError(f"{ENV}: expected {kind}@step=N[,rank=R]{extra}, got {spec!r}")
    rank, ms = fields.get("rank"), float(fields.get("ms", SLOW_MS))
    if not 0 <= ms < 3.6e6:
        raise ValueError(f"{ENV}: ms must be >= 0 and under an hour, got {fields['ms']!r}")
    return Fault(kind, int(fields["step"]), int(rank) if rank is not None else None, ms)


def from_env() -> Fault | None:
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return parse(spec)


class IdRecorder:
    """Appends the global sample ids each optimizer step consumed to ``<folder>/ids-<pid>.jsonl``,
    one JSON line per step: ``{"rank", "epoch", "step", "cursor", "ids"}``, on every attempt."""

    def __init__(self, folder: str):
        self.path = Path(folder) / f"ids-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, rank: int, epoch: int, step: int, cursor: int, ids) -> None:
        flat = [int(i) for part in ids for i in part.tolist()]
        with self.path.open("a") as f:
            f.write(json.dumps({"rank": rank, "epoch": epoch, "step": step, "cursor": cursor, "ids": flat}) + "\n")


def id_recorder_from_env() -> IdRecorder | None:
    """``TRAINFLOW_RECORD_IDS=<folder>``: an ``IdRecorder`` writing there; unset: None (no cost)."""
    folder = os.environ.get(IDS_ENV)
    return IdRecorder(folder) if folder else None


def read_recorded_ids(folder) -> list[dict]:
    """Every line the ``IdRecorder``s wrote under ``folder`` (any order)."""
    return [json.loads(line) for path in sorted(Path(folder).glob("ids-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
