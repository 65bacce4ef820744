"""Fault injection for tests and drills: ``TRAINFLOW_FAULT=<kind>@step=N[,rank=R]``; and
``TRAINFLOW_RECORD_IDS=<folder>``, which makes each rank record the sample ids it trained on.

Kinds: ``kill`` (SIGKILL itself), ``raise`` (an exception), ``hang`` (sleep forever),
``sigterm`` (SIGTERM to itself, as a preemption would). A fault fires once, on the
first attempt only (``TORCHELASTIC_RESTART_COUNT == 0``), so a restarted group
runs clean. Unset, this costs one ``None`` check per step.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "TRAINFLOW_FAULT"
KINDS = ("kill", "raise", "hang", "sigterm")


class InjectedFault(RuntimeError):
    """Raised by the ``raise`` fault."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None

    def due(self, step: int, rank: int) -> bool:
        return step == self.step and self.rank in (None, rank)

    def fire(self, rank: int) -> None:
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "raise":
            raise InjectedFault(f"injected fault on rank {rank} at step {self.step}")
        elif self.kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.kind == "hang":
            while True:
                time.sleep(3600)


def parse(spec: str) -> Fault:
    """``kill@step=30,rank=1`` -> Fault("kill", 30, 1). Raises ValueError on a bad spec."""
    kind, _, rest = spec.partition("@")
    if kind not in KINDS:
        raise ValueError(f"{ENV}: kind must be one of {KINDS}, got {kind!r}")
    fields = dict(part.split("=", 1) for part in rest.split(",") if part)
    if "step" not in fields or set(fields) - {"step", "rank"}:
        raise ValueError(f"{ENV}: expected {kind}@step=N[,rank=R], got {spec!r}")
    rank = fields.get("rank")
    return Fault(kind, int(fields["step"]), int(rank) if rank is not None else None)


def from_env() -> Fault | None:
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return parse(spec)


# -- sample-id recording (tests and drills) ---------------------------------------------------
IDS_ENV = "TRAINFLOW_RECORD_IDS"


class IdRecorder:
    """Appends the global sample ids each optimizer step consumed to ``<folder>/ids-<pid>.jsonl``.

    One JSON line per step and reporting rank: ``{"rank", "epoch", "step", "cursor", "ids"}``
    (``cursor``: where the step started in the epoch's global order). A file per process, opened
    in append mode, so restarts and resized runs add to the same folder without interleaving.
    Unlike a fault it records on every attempt: a test reads the whole story across restarts.
    """

    def __init__(self, folder: str):
        self.path = Path(folder) / f"ids-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, rank: int, epoch: int, step: int, cursor: int, ids) -> None:
        flat = [int(i) for part in ids for i in part.tolist()]
        line = json.dumps({"rank": rank, "epoch": epoch, "step": step, "cursor": cursor, "ids": flat})
        with self.path.open("a") as f:
            f.write(line + "\n")


def id_recorder_from_env() -> IdRecorder | None:
    """``TRAINFLOW_RECORD_IDS=<folder>``: an ``IdRecorder`` writing there; unset: None (no cost)."""
    folder = os.environ.get(IDS_ENV)
    return IdRecorder(folder) if folder else None


def read_recorded_ids(folder) -> list[dict]:
    """Every line the ``IdRecorder``s wrote under ``folder`` (any order)."""
    lines = []
    for path in sorted(Path(folder).glob("ids-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines
