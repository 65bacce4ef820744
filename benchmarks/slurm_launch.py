"""What does the Slurm launcher cost against the local one, for the same world of 2 CPU workers?

    .venv/bin/python benchmarks/slurm_launch.py [--repeats 2]

Starts a two-node Slurm on loopback (tests/slurm_cluster.py: needs slurm-wlm and munge) and, in
alternating rounds, measures for ``--launcher local --nproc 2`` and ``--launcher slurm --nnodes 2
--nproc 1`` on the digits:

- submit-to-first-step: from the launcher's ``start`` (before ``sbatch`` for Slurm) to the first
  optimizer step in the goodput ledger (wall clock), one epoch through ``training.launchers``;
- the whole pipeline's wall: ``trainflow run --config tests/configs/digits-quick.yaml`` as a
  subprocess (its own temporary Prefect server and TRAINFLOW_HOME), its ``timings.total``.

The last line is ``slurm_pipeline_ratio=<median slurm / local pipeline wall>``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, free_port, parser, rounds, table

CONFIG = "tests/configs/digits-quick.yaml"
ARGS = {"local": ["--launcher", "local", "--nproc", "2"],
        "slurm": ["--launcher", "slurm", "--nnodes", "2", "--nproc", "1"]}


def first_step(name: str, work: Path) -> float:
    """Seconds from the launcher's start to the job's first optimizer step (one epoch of digits)."""
    from core.config import load_config
    from core.manifest import read_dvc_file
    from training.goodput import LEDGER_FILE, read_events
    from training.launchers import Hooks, launcher_for
    from training.plan import HostFacts, plan_launch

    cfg = load_config(ROOT / CONFIG, ["training.epochs=1", "training.cpu_workers=1",
                                      f"launcher.slurm.rdzv_port={free_port()}"])
    plan = plan_launch(cfg, HostFacts(), nproc=1 if name == "slurm" else 2, nnodes=2 if name == "slurm" else 1)
    out = Path(tempfile.mkdtemp(dir=work)) / "out"
    out.mkdir()
    md5 = read_dvc_file(ROOT, cfg.dataset.dvc_file).md5
    t0 = time.time()
    launcher_for(name).start(plan, out, ROOT, md5, hooks=Hooks(log=lambda m: None)).finish()
    steps = [ev["t"] for ev in read_events(out / LEDGER_FILE) if ev["ev"] == "step"]
    return min(steps) - t0


def pipeline_wall(name: str, work: Path, env: dict[str, str]) -> float:
    home = Path(tempfile.mkdtemp(dir=work))
    summary = home / "summary.json"
    run_env = {**env, "TRAINFLOW_HOME": str(home / "home"), "PREFECT_HOME": str(home / "prefect")}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        run_env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "run", "--config", CONFIG, *ARGS[name],
                           "--set", "training.cpu_workers=1", "--set", f"launcher.slurm.rdzv_port={free_port()}",
                           "--summary-json", str(summary)], cwd=ROOT, env=run_env, capture_output=True, text=True)
    s = json.loads(summary.read_text())
    if proc.returncode or s.get("status") != "registered":
        raise SystemExit(f"{name}: exit {proc.returncode}: {s.get('error')}\n{proc.stderr[-2000:]}")
    return s["timings"]["total"]


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from tests.slurm_cluster import missing, slurm_cluster

    if gaps := missing():
        print(f"needs {', '.join(gaps)}: apt-get install -y slurm-wlm munge (as root)", file=sys.stderr)
        return 2
    got: dict[str, dict[str, list[float]]] = {n: {"first_step_s": [], "pipeline_s": []} for n in ARGS}
    with tempfile.TemporaryDirectory(prefix="slurm-launch-") as tmp, slurm_cluster(Path(tmp) / "slurm") as cluster:
        os.environ["SLURM_CONF"] = str(cluster.conf)
        work = Path(tmp)
        for i in range(args.repeats):
            for name in rounds(ARGS, i):
                got[name]["first_step_s"].append(first_step(name, work))
                got[name]["pipeline_s"].append(pipeline_wall(name, work, dict(os.environ)))
                print(f"{name:5s} first step {got[name]['first_step_s'][-1]:5.1f} s  "
                      f"pipeline {got[name]['pipeline_s'][-1]:5.1f} s", file=sys.stderr, flush=True)
    med = {n: {k: statistics.median(v) for k, v in got[n].items()} for n in ARGS}
    table(["launcher", "submit/start to first step (s)", "whole pipeline (s)"],
          [[n, f"{med[n]['first_step_s']:.1f}", f"{med[n]['pipeline_s']:.1f}"] for n in ARGS])
    print(f"slurm_first_step_extra_s={med['slurm']['first_step_s'] - med['local']['first_step_s']:.1f}")
    print(f"slurm_pipeline_ratio={med['slurm']['pipeline_s'] / med['local']['pipeline_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
