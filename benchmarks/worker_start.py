"""What does starting the workers cost: torchrun's exec of ``python -m training.worker`` per worker,
against forking them from the agent (``training/agent.py``, what CPU jobs do)?

    .venv/bin/python benchmarks/worker_start.py [--repeats 3] [--nproc 2]

CPU seconds are this process's reaped children's: the agent and its workers. The last line is
``fork_cpu_ratio=<fork / exec CPU>``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, parser, rounds, table


def one(mode: str, workdir: Path, nproc: int) -> dict:
    from core.config import load_config
    from training.launcher import make_spec, run_job
    from training.plan import HostFacts, plan_launch

    cfg = load_config(ROOT / "tests" / "configs" / "digits-engine.yaml", ["training.epochs=1"])
    spec = make_spec(plan_launch(cfg, HostFacts(), nproc), Path(tempfile.mkdtemp(dir=workdir)) / "out", ROOT, "bench")
    spec = dataclasses.replace(spec, fork_workers=mode == "fork")
    before, t0 = os.times(), time.perf_counter()
    result = run_job(spec)
    wall, after = time.perf_counter() - t0, os.times()
    cpu = after.children_user - before.children_user + after.children_system - before.children_system
    return {"wall_s": wall, "cpu_s": cpu, "startup_s": result["goodput"]["startup_s"]}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {"exec": [], "fork": []}
    with tempfile.TemporaryDirectory(prefix="worker-start-") as tmp:
        one("fork", Path(tmp), args.nproc)  # warm-up: page cache, data
        for i in range(args.repeats):
            for mode in rounds(("exec", "fork"), i):
                r = one(mode, Path(tmp), args.nproc)
                runs[mode].append(r)
                print(f"{mode:4s} wall {r['wall_s']:5.1f} s  cpu {r['cpu_s']:5.1f} s  start-up {r['startup_s']:4.1f} s",
                      flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "startup_s")}
           for m, rs in runs.items()}
    table(["start", "wall s", "CPU s (agent + workers)", "start-up s"],
          [[m, *(f"{v[k]:.1f}" for k in ("wall_s", "cpu_s", "startup_s"))] for m, v in med.items()])
    print(f"fork_cpu_ratio={med['fork']['cpu_s'] / med['exec']['cpu_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
