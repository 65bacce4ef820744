"""Fault injection for tests and drills: ``TRAINFLOW_FAULT=<kind>@step=N[,rank=R]``.

Kinds: ``kill`` (SIGKILL itself), ``raise`` (an exception), ``hang`` (sleep forever),
``sigterm`` (SIGTERM to itself, as a preemption would), and ``slow@step=N,rank=R,ms=M``:
from step N on, that rank sleeps M ms (default 50) after every step, a straggler (its
peers then wait for it in the all-reduce). The others fire once. Every fault fires on the
first attempt only (``TORCHELASTIC_RESTART_COUNT == 0``), so a restarted group runs clean.
Unset, this costs one ``None`` check per step.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = "TRAINFLOW_FAULT"
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
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.kind == "raise":
            raise InjectedFault(f"injected fault on rank {rank} at step {self.step}")
        elif self.kind == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
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
    if not (ms >= 0 and ms < 3.6e6):
        raise ValueError(f"{ENV}: ms must be >= 0 and under an hour, got {fields['ms']!r}")
    return Fault(kind, int(fields["step"]), int(rank) if rank is not None else None, ms)


def from_env() -> Fault | None:
    spec = os.environ.get(ENV)
    if not spec or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return None
    return parse(spec)
