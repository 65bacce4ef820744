"""Goodput with one injected SIGKILL against none, and where a restart's seconds go.

    .venv/bin/python benchmarks/goodput.py --repeats 2        # clean, killed, clean, killed

Each repeat runs two torchrun jobs of ``tests/configs/digits-engine.yaml``; in the second, rank 1
SIGKILLs itself at ``--kill-step`` and torchrun restarts the group from the last checkpoint. A
thread polls the agent's workers every 10 ms (``/proc``), so with the ledger the restart splits into
torchrun's own cost (death -> new workers) and the new worker's start-up (process start -> first
step). The ledger's ``restart_s`` runs from the last heartbeat, up to ``BEAT_S`` more. Last line:
``goodput_killed_over_clean=<median ratio>``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, median, parser

from core.config import load_config
from core.procs import children, pid_alive
from training.goodput import BEAT_S, LEDGER_FILE, Ledger, read_events
from training.launcher import make_spec, start_job
from training.plan import HostFacts, plan_launch

CONFIG = ROOT / "tests" / "configs" / "digits-engine.yaml"


class Watcher(threading.Thread):
    """Notes when each worker of a torchrun agent is first seen and when it dies (10 ms polls)."""

    def __init__(self, agent_pid: int):
        super().__init__(daemon=True)
        self.agent_pid, self.seen, self.died = agent_pid, {}, {}
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.time()
            for pid in children(self.agent_pid):
                self.seen.setdefault(pid, now)
            for pid in self.seen:
                if pid not in self.died and not pid_alive(pid):
                    self.died[pid] = now
            time.sleep(0.01)

    def death_and_respawn(self) -> tuple[float | None, float | None, float | None]:
        """(first worker death, last death of that generation: the survivors stopped, first new worker)."""
        if not self.died:
            return None, None, None
        death = min(self.died.values())
        first_gen = [pid for pid, t in self.seen.items() if t <= death]
        stopped = max((self.died.get(pid, death) for pid in first_gen), default=death)
        later = [t for t in self.seen.values() if t > death]
        return death, stopped, (min(later) if later else None)


def run_job(out: Path, overrides: list[str], env: dict | None, watch: bool) -> dict:
    cfg = load_config(CONFIG, overrides)
    job = start_job(make_spec(plan_launch(cfg, HostFacts(), 2), out, ROOT, "bench-data-md5", env=env))
    watcher = Watcher(job.proc.pid) if watch else None
    if watcher:
        watcher.start()
    try:
        result = job.finish()
    finally:
        if watcher:
            watcher.halt.set()
            watcher.join()
    rec = {"result": result, "events": read_events(out / LEDGER_FILE)}
    if watcher:
        rec["death"], rec["stopped"], rec["respawn"] = watcher.death_and_respawn()
    return rec


def restart_split(rec: dict) -> dict:
    """Death -> first step after resume, split at torchrun's respawn (watched) and the ledger's
    process start of the new attempt's rank 0."""
    starts = [e for e in rec["events"] if e["ev"] == "start"]
    firsts = [e for e in rec["events"] if e["ev"] == "step"]
    death = rec.get("death")
    if death is None or len(starts) < 2 or len(firsts) < 2:
        return {}
    t0, first = starts[1]["t0"] or starts[1]["t"], firsts[1]["t"]
    return {"death_to_first_step_s": first - death, "torchrun_s": (rec["respawn"] or t0) - death,
            "survivors_stopped_s": rec["stopped"] - death, "worker_s": first - t0, "rank0_process_start_s": t0 - death,
            "ledger_restart_s": rec["result"]["goodput"]["restart_s"]}


def heartbeat_cost_us(n: int = 200_000) -> float:
    """Seconds per ``Ledger.step`` call on rank 0 (throttled appends included), in microseconds."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger.for_rank(True, Path(tmp))
        ledger.step(0)
        t = time.perf_counter()
        for i in range(1, n + 1):
            ledger.step(i)
        cost = (time.perf_counter() - t) / n
        ledger.close()
    return cost * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--every", type=int, default=10, help="checkpoint every N steps")
    ap.add_argument("--kill-step", type=int, default=50)
    ap.add_argument("--keep", action="store_true", help="keep the runs' folders")
    ap.add_argument("--json", type=Path, help="write every record here")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    job = [f"training.epochs={args.epochs}", f"training.checkpoint_every_steps={args.every}",
           "training.max_restarts=1"]
    tmp = Path(tempfile.mkdtemp(prefix="trainflow-goodput-"))
    print(f"trainflow goodput: {CONFIG.name}, 2 procs x gloo, {args.epochs} epochs, checkpoint every {args.every} "
          f"steps, kill rank 1 at step {args.kill_step}; {args.repeats} repeat(s), machine shared: read ratios",
          flush=True)
    pairs = []
    t_start = time.perf_counter()
    try:
        for i in range(args.repeats):
            clean = run_job(tmp / f"clean{i}", job, None, watch=False)
            killed = run_job(tmp / f"killed{i}", job, {"TRAINFLOW_FAULT": f"kill@step={args.kill_step},rank=1"},
                             watch=True)
            pairs.append((clean, killed))
            for name, rec in (("clean", clean), ("killed", killed)):
                g = rec["result"]["goodput"]
                print(f"  [{i}] {name:6s} goodput {g['goodput']:.3f}  wall {g['wall_s']:6.2f} s = productive "
                      f"{g['productive_s']:6.2f} + start-up {g['startup_s']:5.2f} + restart {g['restart_s']:5.2f} + "
                      f"lost {g['lost_s']:4.2f} ({g['lost_steps']} steps) + stalls {g['checkpoint_stall_s']:4.2f}; "
                      f"restarts {rec['result']['restarts']}", flush=True)
            split = restart_split(killed)
            if split:
                print(f"  [{i}] restart: death -> first step after resume {split['death_to_first_step_s']:.2f} s = "
                      f"torchrun (death -> new workers) {split['torchrun_s']:.2f} s [of which the surviving "
                      f"worker's exit {split['survivors_stopped_s']:.2f} s] + worker (process start -> "
                      f"first step) {split['worker_s']:.2f} s; ledger restart_s {split['ledger_restart_s']:.2f} s "
                      f"(from the last heartbeat)", flush=True)
    finally:
        if args.json:
            args.json.write_text(json.dumps([{"clean": c, "killed": k} for c, k in pairs], indent=2, default=str))
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    hb = heartbeat_cost_us()
    steps = [k["result"]["goodput"]["step_time_s"] for _, k in pairs if k["result"]["goodput"]["step_time_s"]]

    def med(xs):
        return median(xs) if xs else float("nan")

    print("== medians ==", flush=True)
    gc = med([c["result"]["goodput"]["goodput"] for c, _ in pairs])
    gk = med([k["result"]["goodput"]["goodput"] for _, k in pairs])
    splits = [s for s in (restart_split(k) for _, k in pairs) if s]
    print(f"  goodput clean {gc:.3f}, with one SIGKILL {gk:.3f}", flush=True)
    if splits:
        print(f"  restart (death -> first step after resume) {med([s['death_to_first_step_s'] for s in splits]):.2f} s;"
              f" torchrun's own part {med([s['torchrun_s'] for s in splits]):.2f} s (the surviving worker's exit "
              f"{med([s['survivors_stopped_s'] for s in splits]):.2f} s of it); the worker's start-up "
              f"{med([s['worker_s'] for s in splits]):.2f} s", flush=True)
    print(f"  heartbeat: {hb:.2f} us per step on rank 0 (an append every {BEAT_S} s), "
          f"{hb / 1e6 / med(steps) * 100 if steps else float('nan'):.3f} % of a {med(steps) * 1e3:.1f} ms step",
          flush=True)
    print(f"benchmark wall {time.perf_counter() - t_start:.1f} s", flush=True)
    print(f"goodput_killed_over_clean={gk / gc:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
