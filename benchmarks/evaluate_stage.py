"""How long does the pipeline's ``evaluate`` stage take? Two code trees side by side.

    git worktree add /tmp/trainflow-old <old commit>
    .venv/bin/python benchmarks/evaluate_stage.py --home /tmp/ef-home --tree old=/tmp/trainflow-old --repeats 5 --rescored

Each measurement is a fresh process (one evaluate per process, as in ``trainflow run``) that
imports what the CLI imports before the flow (``--cold`` skips that) and times the ``evaluate``
task's function on the newest trained model of ``--home``; trees alternate. ``--home`` must hold a
champion and a finished training folder; without one, ``trainflow run`` runs twice into it first.
The last line is ``evaluate_s <label>=<median> ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import ROOT

CHILD = r"""
import json, os, sys, time
from pathlib import Path
home, cold, rescore = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
from core.env import apply_offline_env
apply_offline_env(home)
if not cold:
    import torch, mlflow, prefect  # noqa: F401  (imported by the CLI before the flow)
if rescore:  # as after a metric-code change: the champion's recorded scores no longer apply
    import evaluation.champion as champion
    champion.recorded_metrics = lambda *a: None
from core.config import load_config
from core.manifest import build_manifest, image_from_env
from core.paths import tracking_uri
from flows.pipeline import RunContext, evaluate
from registry import store
from tasks import get_task
from training.plan import HostFacts, plan_launch
root = Path.cwd()
cfg = load_config(root / "configs" / "digits.yaml", {})
folders = [p for p in (home / "train").glob(f"{cfg.name}-*") if (p / "model.pt2").is_file()]
folder = max(folders, key=lambda p: (p / "model.pt2").stat().st_mtime)
plan = plan_launch(cfg, HostFacts(), 2)
manifest = build_manifest(root, cfg.name, cfg.config_id(), cfg.dataset.dvc_file, cfg.seed, plan.world,
                          image_from_env(None, None))
uri = tracking_uri(home)
exp = store.configure(uri, cfg.registry.experiment, home / "mlartifacts")
run_id = store.start_run(exp, "bench-evaluate", {"trainflow.stage": "bench"})
out = home / "runs" / run_id
out.mkdir(parents=True, exist_ok=True)
ctx = RunContext(cfg, get_task(cfg.task), root, home, uri, run_id, manifest, out, plan)
t0 = time.perf_counter()
report = evaluate.fn(ctx, {"out_dir": str(folder), "model_pt2": "model.pt2"})
wall = time.perf_counter() - t0
store.end_run(run_id, "FINISHED")
print("RESULT " + json.dumps({"evaluate_s": wall, "champion_version": report.get("champion_version"),
                              "champion_scores": report.get("champion_scores"),
                              "accuracy": report["candidate"]["accuracy"],
                              "champion_accuracy": (report["champion"] or {}).get("accuracy")}))
"""


def _env(home: Path, **extra) -> dict:
    env = {**os.environ, "TRAINFLOW_HOME": str(home), **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def measure(tree: Path, home: Path, cold: bool, rescore: bool = False) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(home), str(int(cold)), str(int(rescore))], cwd=tree,
                          env=_env(home, PYTHONPATH=str(tree)), capture_output=True, text=True, timeout=600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{tree}: evaluate failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def warm_up(home: Path) -> None:
    for _ in range(2):
        subprocess.run([str(Path(sys.executable).parent / "trainflow"), "run"], cwd=ROOT, env=_env(home), check=True,
                       capture_output=True, timeout=900)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="a warm TRAINFLOW_HOME (made warm if it is not)")
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                    help="another code tree to compare with this checkout (repeatable)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="do not pre-import what the CLI pre-imports")
    ap.add_argument("--rescored", action="store_true",
                    help="also time this checkout with the champion's recorded scores made stale (the fallback)")
    args = ap.parse_args(argv)
    trees = {"new": ROOT, **{t.split("=", 1)[0]: Path(t.split("=", 1)[1]).resolve() for t in args.tree}}
    home = args.home.resolve()
    if not (home / "mlflow.db").is_file():
        print(f"warming {home}: two `trainflow run`s", flush=True)
        warm_up(home)
    runs = [(label, tree, False) for label, tree in trees.items()]
    if args.rescored:
        runs.insert(1, ("new-rescored", ROOT, True))
    times: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for i in range(args.repeats):
        for label, tree, rescore in runs:
            r = measure(tree, home, args.cold, rescore)
            times[label].append(r["evaluate_s"])
            print(f"repeat {i} {label}: evaluate {r['evaluate_s']:.3f}s, champion v{r['champion_version']} "
                  f"({r['champion_scores'] or 'rescored'}), accuracy {r['accuracy']:.4f} vs champion "
                  f"{r['champion_accuracy']}", flush=True)
    print("evaluate_s " + " ".join(f"{label}={statistics.median(v):.3f}" for label, v in times.items()))


if __name__ == "__main__":
    main()
