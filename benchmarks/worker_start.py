"""What does starting the workers cost: torchrun's exec of ``python -m training.worker`` per worker,
against forking them from the agent (``training/agent.py``, what CPU jobs do)?

One short digits job (``tests/configs/digits-engine.yaml``, 1 epoch, 2 CPU workers, a fresh
``--out`` each time) launched through ``training.launcher.run_job``, alternating ``exec`` and
``fork`` in one invocation (the machine is shared: only figures measured side by side mean
anything). For each it prints the job's wall seconds, the CPU seconds of the agent and its
workers (this process's reaped children) and the job's start-up (``goodput.startup_s``: the
first worker's start to the first step). The last line is ``fork_cpu_ratio=<fork / exec CPU>``.

Usage::

    .venv/bin/python benchmarks/worker_start.py [--repeats 3] [--nproc 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one(mode: str, workdir: Path, nproc: int) -> dict:
    from core.config import load_config
    from training.launcher import make_spec, run_job

    cfg = load_config(ROOT / "tests" / "configs" / "digits-engine.yaml", ["training.epochs=1"])
    spec = make_spec(cfg, Path(tempfile.mkdtemp(dir=workdir)) / "out", ROOT, "bench", nproc=nproc)
    spec = dataclasses.replace(spec, fork_workers=mode == "fork")
    before, t0 = os.times(), time.perf_counter()
    result = run_job(spec)
    wall, after = time.perf_counter() - t0, os.times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    return {"wall_s": wall, "cpu_s": cpu, "startup_s": result["goodput"]["startup_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"exec": [], "fork": []}
    with tempfile.TemporaryDirectory(prefix="worker-start-") as tmp:
        one("fork", Path(tmp), args.nproc)  # warm-up: page cache, data
        for i in range(args.repeats):
            for mode in (("exec", "fork") if i % 2 == 0 else ("fork", "exec")):
                r = one(mode, Path(tmp), args.nproc)
                runs[mode].append(r)
                print(f"{mode:4s} wall {r['wall_s']:5.1f} s  cpu {r['cpu_s']:5.1f} s  start-up {r['startup_s']:4.1f} s",
                      flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "startup_s")}
           for m, rs in runs.items()}
    print("| start | wall s | CPU s (agent + workers) | start-up s |")
    print("|---|---|---|---|")
    for m, v in med.items():
        print(f"| {m} | {v['wall_s']:.1f} | {v['cpu_s']:.1f} | {v['startup_s']:.1f} |")
    print(f"fork_cpu_ratio={med['fork']['cpu_s'] / med['exec']['cpu_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
