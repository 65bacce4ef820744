"""The goodput ledger: how much of a training's wall time went into steps it kept.

Rank 0 appends JSON events to ``<out>/goodput.jsonl``, each flushed as it happens (survives SIGKILL;
no fsync: a power cut costs a second of accounting). Events (``ev``), each at wall-clock ``t``:
``start`` (``job``, ``attempt``: torchrun's run id and restart count, ``world``, ``t0``: the process's
start), ``resume`` (``step``; null: fresh), ``interval`` (``choose_interval``'s answer), ``step`` (the
attempt's first) and ``beat`` (later ones, at most every ``BEAT_S``), ``ckpt`` (``step``, ``stall_s``),
``finish`` (``status``: completed | preempted; an attempt without it died). The launcher on the
flow's host adds ``resubmit`` (``job``: the new one, ``after``: the ending that left a checkpoint to
resume, PREEMPTED | TIMEOUT) when a cluster job is submitted again.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from pathlib import Path

from core.metrics_file import MetricsWriter

log = logging.getLogger("trainflow.train")

LEDGER_FILE = "goodput.jsonl"
# Heartbeat period: the restart time is over-, the lost steps under-estimated by at most this much.
BEAT_S = 0.5


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 on a first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def process_start_time() -> float | None:
    """This process's start in epoch seconds (Linux ``/proc``; None elsewhere): a worker's start-up
    (interpreter, imports) is part of what a restart costs."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the parenthesised name
        # starttime counts from boot; /proc/stat's btime is whole seconds, so anchor on the clock itself.
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Ledger:
    """Rank 0's appender to ``<out>/goodput.jsonl``; other ranks get one that writes nothing.
    ``step(n)`` is on the hot path: an append only when ``BEAT_S`` has passed."""

    def __init__(self, path: Path | None, clock=time.time):
        self.path = Path(path) if path is not None else None
        self._out = MetricsWriter(self.path, separators=None) if path is not None else None
        self._clock = clock
        self._next_beat = None

    @classmethod
    def for_rank(cls, is_main: bool, out_dir: Path) -> "Ledger":
        return cls(Path(out_dir) / LEDGER_FILE if is_main else None)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _write(self, ev: str, **fields) -> None:
        if self._out is not None:
            self._out.write({"ev": ev, "t": round(self._clock(), 4), **fields})

    def start(self, world_size: int) -> None:
        """An attempt begins (call once per process, before resuming)."""
        if self.enabled:
            self._write("start", job=os.environ.get("TORCHELASTIC_RUN_ID") or f"local-{uuid.uuid4().hex[:12]}",
                        attempt=restart_count(), world=world_size, t0=process_start_time())

    def resumed(self, step: int | None) -> None:
        self._write("resume", step=step)

    def interval(self, choice: dict) -> None:
        self._write("interval", **choice)

    def step(self, step: int) -> None:
        """Optimizer step ``step`` is done: the attempt's first is recorded, later ones as a beat."""
        if not self.enabled:
            return
        now = self._clock()
        if self._next_beat is None or now >= self._next_beat:
            self._write("step" if self._next_beat is None else "beat", step=step)
            self._next_beat = now + BEAT_S

    def checkpoint(self, step: int, stall_s: float) -> None:
        self._write("ckpt", step=step, stall_s=round(stall_s, 6))

    def finish(self, status: str, step: int) -> None:
        """The attempt ends on its own (completed, preempted); closes the file."""
        self._write("finish", status=status, step=step)
        self.close()

    def resubmitted(self, job: str, after: str) -> None:
        """The launcher submitted ``job`` again after the ending ``after``; closes the file."""
        self._write("resubmit", job=job, after=after)
        self.close()

    def close(self) -> None:
        if self._out is not None:
            self._out.close()

    def events(self) -> list[dict]:
        """Every readable event so far (rank 0; [] elsewhere)."""
        return read_events(self.path) if self.enabled else []


def read_events(path: Path) -> list[dict]:
    """The events of a ledger file, oldest first; torn or foreign lines are skipped."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [ev for ev in map(_json, text.splitlines())
            if isinstance(ev, dict) and isinstance(ev.get("ev"), str) and _num(ev.get("t"))]


def _json(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _step(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class _Attempt:
    """One worker-group attempt, as its events tell it."""

    def __init__(self, ev: dict):
        self.job = ev.get("job")
        self.attempt = _step(ev.get("attempt")) or 0
        self.t0 = ev["t0"] if _num(ev.get("t0")) and ev["t0"] <= ev["t"] else ev["t"]
        self.last_t = ev["t"]
        self.resumed: int | None = None
        self.first_step_t: float | None = None
        self.marks: list[tuple[float, int]] = []  # (t, step) of every step, beat, ckpt, finish
        self.stalls: list[tuple[int, float]] = []  # (step, seconds) of each checkpoint
        self.finish: str | None = None
        self.resubmits = 0  # the launcher's, after this attempt's job ended

    @property
    def last_step(self) -> int:
        return max([s for _, s in self.marks] + [self.resumed or 0])

    @property
    def last_mark_t(self) -> float:
        return self.marks[-1][0] if self.marks else self.last_t

    def time_at(self, step: int) -> float:
        """When this attempt was done with ``step``: its last mark there, else interpolated between
        the marks around it (its first mark when ``step`` lies before them all)."""
        exact = [t for t, s in self.marks if s == step]
        if exact:
            return exact[-1]
        before = [(t, s) for t, s in self.marks if s < step]
        after = [(t, s) for t, s in self.marks if s > step]
        if not after:
            return self.last_mark_t
        if not before:
            return after[0][0]
        (t0, s0), (t1, s1) = before[-1], after[0]
        return t0 + (t1 - t0) * (step - s0) / (s1 - s0)

    def restarts(self, prev: "_Attempt | None") -> bool:
        """A torchrun restart of ``prev``: same job, a higher restart count (a rerun counts from 0)."""
        return prev is not None and prev.job == self.job and self.attempt > prev.attempt

    def add(self, ev: dict) -> None:
        if ev["ev"] == "resubmit":  # written between jobs: the gap between jobs is not this attempt's
            self.resubmits += 1
            return
        self.last_t = max(self.last_t, ev["t"])
        kind, step = ev["ev"], _step(ev.get("step"))
        if kind == "resume":
            self.resumed = step
        elif kind in ("step", "beat", "ckpt", "finish") and step is not None:
            if kind == "step" and self.first_step_t is None:
                self.first_step_t = ev["t"]
            self.marks.append((ev["t"], step))
            if kind == "ckpt" and _num(ev.get("stall_s")) and ev["stall_s"] >= 0:
                self.stalls.append((step, ev["stall_s"]))
        if kind == "finish":
            self.finish = ev.get("status") if isinstance(ev.get("status"), str) else "unknown"


def _attempts(events: list[dict]) -> list[_Attempt]:
    """The attempts of the current training: from its last fresh start (nothing resumed) that is not
    a restart within one job (that one died before its first checkpoint) on."""
    attempts: list[_Attempt] = []
    for ev in events:
        if ev["ev"] == "start":
            attempts.append(_Attempt(ev))
        elif attempts:
            attempts[-1].add(ev)
    begin = 0
    for i, a in enumerate(attempts):
        if a.resumed is None and not a.restarts(attempts[i - 1] if i else None):
            begin = i
    return attempts[begin:]


def summarise(events: list[dict]) -> dict:
    """The goodput figures of the training whose ledger ``events`` are (pure): ``wall_s`` (each job's
    span: the gap between jobs is not counted, between a job's attempts it is), ``startup_s``,
    ``restart_s`` (a death's last event to the next first step), ``lost_s`` (steps repeated),
    ``checkpoint_stall_s``, ``productive_s`` (the rest) and ``goodput`` = productive / wall."""
    attempts = _attempts(events)
    wall = startup = restart = lost_s = stall = 0.0
    lost_steps = failures = jobs = ckpts = 0
    step_span = steps_done = 0.0
    restarts = []
    prev: _Attempt | None = None
    for a in attempts:
        stepped_t = a.first_step_t if a.first_step_t is not None else a.last_t
        if a.restarts(prev):
            wall += a.last_t - prev.last_t
            gap = stepped_t - prev.last_t
            restart += gap
            restarts.append({"attempt": a.attempt, "restart_s": round(gap, 3),
                             "agent_s": round(a.t0 - prev.last_mark_t, 3),
                             "worker_s": round(stepped_t - a.t0, 3) if a.first_step_t is not None else None,
                             "resumed_from_step": a.resumed, "lost_steps": max(0, prev.last_step - (a.resumed or 0))})
        else:
            jobs += 1
            wall += a.last_t - a.t0
            startup += stepped_t - a.t0
        if prev is not None:
            resumed = a.resumed or 0
            lost_steps += max(0, prev.last_step - resumed)
            if prev.last_step > resumed:
                # its checkpoints after the resumed step (an async write a death cut short) are stalls already
                redone = prev.last_mark_t - prev.time_at(resumed) - sum(x for st, x in prev.stalls if st > resumed)
                lost_s += max(0.0, redone)
            if prev.finish is None:
                failures += 1
        stall += sum(x for _, x in a.stalls)
        ckpts += len(a.stalls)
        if a.first_step_t is not None and len(a.marks) > 1:
            first_t, first_s = a.marks[0]
            step_span += a.last_mark_t - first_t
            steps_done += a.last_step - first_s
        prev = a
    productive = max(0.0, wall - startup - restart - lost_s - stall)
    r = lambda v: round(v, 3)  # noqa: E731 - ms is the ledger's resolution
    return {
        "wall_s": r(wall), "productive_s": r(productive), "goodput": round(productive / wall, 4) if wall > 0 else None,
        "startup_s": r(startup), "restart_s": r(restart), "lost_steps": lost_steps, "lost_s": r(lost_s),
        "checkpoint_stall_s": r(stall), "checkpoints": ckpts,
        "attempts": len(attempts), "jobs": jobs, "failures": failures,
        "resubmits": sum(a.resubmits for a in attempts),
        "mtbf_s": r(wall / failures) if failures else None,
        "checkpoint_cost_s": round(stall / ckpts, 6) if ckpts else None,
        "step_time_s": round(step_span / steps_done, 6) if steps_done > 0 else None,
        "restarts": restarts,
    }


# The ledger's figures a run summary shows.
HEADLINE = ("goodput", "productive_s", "wall_s", "startup_s", "restart_s", "lost_steps", "lost_s",
            "checkpoint_stall_s", "failures")


def headline(summary: dict | None) -> dict:
    """The ``HEADLINE`` figures of a ``summarise`` answer ({} for none: e.g. an older result.json)."""
    return {k: summary[k] for k in HEADLINE if k in summary} if summary else {}


def describe(summary: dict | None) -> str:
    """One line for people: ``goodput 0.62: 6.2 s productive of 10.0 s wall (...)``; "" for none."""
    g = summary or {}
    if g.get("goodput") is None:
        return ""
    return (f"goodput {g['goodput']:.3f}: {g['productive_s']:.1f} s productive of {g['wall_s']:.1f} s wall "
            f"(start-up {g['startup_s']:.1f} s, {g['failures']} failure(s) costing {g['restart_s']:.1f} s of "
            f"restart and {g['lost_steps']} repeated step(s) {g['lost_s']:.1f} s, checkpoint stalls "
            f"{g['checkpoint_stall_s']:.1f} s)")


def brief(summary: dict | None) -> str:
    """The run summary's one line: ``goodput 91 %: 8 % start-up, 1 % checkpoint stalls``; "" for none.
    After the colon, where the rest of the wall time went, largest first, zeros left out."""
    g = summary or {}
    wall = g.get("wall_s") or 0
    if g.get("goodput") is None or wall <= 0:
        return ""
    parts = [(g.get("startup_s") or 0, "start-up"),
             ((g.get("restart_s") or 0) + (g.get("lost_s") or 0), "restarts"),
             (g.get("checkpoint_stall_s") or 0, "checkpoint stalls")]
    shares = [(100 * s / wall, name) for s, name in sorted(parts, key=lambda p: -p[0]) if s > 0]
    lost = ", ".join(f"{p:.0f} % {name}" if p >= 0.5 else f"<1 % {name}" for p, name in shares)
    return f"goodput {100 * g['goodput']:.0f} %" + (f": {lost}" if lost else "")


def young_daly_seconds(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Young-Daly's checkpoint period sqrt(2 * C * MTBF): the first-order optimum of time lost to
    checkpoints plus work redone after a failure."""
    for name, v in (("checkpoint_cost_s", checkpoint_cost_s), ("mtbf_s", mtbf_s)):
        if not _num(v) or v <= 0:
            raise ValueError(f"{name}: must be a finite number > 0, got {v!r}")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)


def young_daly_steps(checkpoint_cost_s: float, mtbf_s: float, step_time_s: float) -> int:
    """``young_daly_seconds`` in whole optimizer steps of ``step_time_s`` each (at least 1)."""
    if not _num(step_time_s) or step_time_s <= 0:
        raise ValueError(f"step_time_s: must be a finite number > 0, got {step_time_s!r}")
    return max(1, round(young_daly_seconds(checkpoint_cost_s, mtbf_s) / step_time_s))


def choose_interval(mode: str, fixed_steps: int | None, events: list[dict]) -> dict:
    """The mid-epoch checkpoint interval in steps (pure): ``fixed_steps`` (None: epoch ends only), or
    under ``auto`` Young-Daly from the ledger's measurements once a failure was seen."""
    if mode not in ("fixed", "auto"):
        raise ValueError(f"training.checkpoint_every: must be 'fixed' or 'auto', got {mode!r}")
    if fixed_steps is not None and (_step(fixed_steps) is None or fixed_steps == 0):
        raise ValueError(f"training.checkpoint_every_steps: must be an integer > 0 or null, got {fixed_steps!r}")
    fixed = {"mode": mode, "rule": "fixed", "steps": fixed_steps}
    if mode == "fixed":
        return {**fixed, "reason": "training.checkpoint_every: fixed"}
    s = summarise(events)
    inputs = {k: s[k] for k in ("checkpoint_cost_s", "mtbf_s", "step_time_s", "failures")}
    if not s["failures"]:
        return {**fixed, **inputs, "reason": "no failure seen yet: the fixed interval"}
    missing = [k for k in ("checkpoint_cost_s", "step_time_s") if not s[k]]
    if missing:
        return {**fixed, **inputs, "reason": f"not measured yet ({', '.join(missing)}): the fixed interval"}
    steps = young_daly_steps(s["checkpoint_cost_s"], s["mtbf_s"], s["step_time_s"])
    return {"mode": mode, "rule": "young_daly", "steps": steps, **inputs,
            "reason": (f"sqrt(2 x {s['checkpoint_cost_s']:.4g} s checkpoint x {s['mtbf_s']:.4g} s MTBF) = "
                       f"{young_daly_seconds(s['checkpoint_cost_s'], s['mtbf_s']):.4g} s = {steps} steps "
                       f"of {s['step_time_s']:.4g} s")}


def agree_interval(ctx, ledger: Ledger, mode: str, fixed_steps: int | None) -> dict:
    """COLLECTIVE under ``auto``: this attempt's ``choose_interval`` answer, rank 0's from its ledger,
    broadcast (every rank must save at the same steps); recorded in the ledger."""
    if mode == "fixed":
        choice = choose_interval("fixed", fixed_steps, [])
    else:
        from training.distributed import broadcast_object

        mine = choose_interval(mode, fixed_steps, ledger.events()) if ctx.is_main else None
        choice = broadcast_object(ctx, mine)
        if ctx.is_main:
            log.info("checkpoint interval: %s (%s)", f"every {choice['steps']} steps" if choice["steps"]
                     else "epoch ends only", choice["reason"])
    ledger.interval(choice)
    return choice
