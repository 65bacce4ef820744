"""Fault injection for tests and drills: ``TRAINFLOW_FAULT=<kind>@step=N[,rank=R]``.

Kinds: ``kill`` (SIGKILL itself), ``raise`` (an exception), ``hang`` (sleep forever),
``sigterm`` (SIGTERM to itself, as a preemption would). A fault fires once, on the
first attempt only (``TORCHELASTIC_RESTART_COUNT == 0``), so a restarted group
runs clean. Unset, this costs one ``None`` check per step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

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
