"""The registered model beside the one a user would try first: trainflow's candidate against
scikit-learn's gradient-boosted trees on the same train split.

    .venv/bin/python benchmarks/tabular_quality.py                    # wine, digits, tests/tables.py's shapes, hotels
    .venv/bin/python benchmarks/tabular_quality.py --only penguins,churn
    .venv/bin/python benchmarks/tabular_quality.py --only loans          # 5 % "bad": judged by average precision

Each dataset runs ``trainflow run`` in a temporary project of its own; the pipeline's evaluation fits
the trees and records both, so the figures come from each run's summary. Last line:
``worst_gap_to_gbdt=x`` (trees minus candidate in the metric's direction; the aim is at most 0.02).
The metric is each run's primary one (``primary_metric``, which init picks from the data); a
classifier's ROC AUC is printed beside the trees' too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, parser, table

from core.env import TELEMETRY_OFF

BUNDLED = ("wine", "digits")
SHAPES = ("penguins", "houses", "churn", "loans")
# A table with an ISO date and a timestamp with hours, some missing (tests/tables.py: hotels): init
# turns both into their parts (dataset.dates).
DATED = ("hotels",)
ENV = {**TELEMETRY_OFF, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b",
       "GIT_COMMITTER_EMAIL": "b@b"}


def _run(cmd: list[str], cwd: Path, env: dict, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def project(work: Path, name: str) -> Path:
    """A git + DVC project of its own: a copy of this checkout's tracked files (bundled data pulled)
    for wine and digits, an empty one for a shape."""
    proj = work / name
    bin_ = Path(sys.executable).parent
    env = {**os.environ, **ENV}
    if name in BUNDLED:
        _run(["git", "clone", "-q", str(ROOT), str(proj)], work, env).check_returncode()
        _run([str(bin_ / "dvc"), "pull", "-q"], proj, env)
        return proj
    (proj / "data").mkdir(parents=True)
    for cmd in (["git", "init", "-q"], [str(bin_ / "dvc"), "init", "-q"],
                [str(bin_ / "dvc"), "config", "core.analytics", "false"]):
        _run(cmd, proj, env).check_returncode()
    return proj


def measure(work: Path, name: str) -> dict:
    """Run the pipeline on ``name`` in its own project; its summary's figures."""
    proj = project(work, name)
    env = {**os.environ, **ENV, "TRAINFLOW_HOME": str(proj / ".trainflow")}
    env.pop("PREFECT_API_URL", None)
    if name in SHAPES or name in DATED:
        from flows.init import init_project
        from tests.tables import write_shape

        label = write_shape(name, proj / "data" / name)
        init_project(proj, f"data/{name}", label)
        _run(["git", "add", "-A"], proj, env).check_returncode()
        _run(["git", "commit", "-qm", name], proj, env).check_returncode()
    summary = proj / "summary.json"
    t0 = time.perf_counter()
    done = _run([str(Path(sys.executable).parent / "trainflow"), "run", "--config", f"configs/{name}.yaml",
                 "--summary-json", str(summary)], proj, env)
    wall = time.perf_counter() - t0
    if not summary.is_file():
        raise RuntimeError(f"{name}: no summary (exit {done.returncode}): {done.stderr[-2000:]}")
    s = json.loads(summary.read_text())
    g = s.get("gbdt") or {}
    if s.get("status") not in ("registered", "rejected") or not g:
        raise RuntimeError(f"{name}: {s.get('status')}: {s.get('error')}\n{done.stderr[-2000:]}")
    metric = g["primary"]
    sign = 1 if g.get("higher_is_better", True) else -1
    return {"dataset": name, "metric": metric, "candidate": s["metrics"][metric], "gbdt": g[metric],
            "gap": round(sign * (g[metric] - s["metrics"][metric]), 4), "train_s": g["candidate_train_s"],
            "gbdt_fit_s": g["fit_s"], "run_s": round(wall, 1), "status": s["status"],
            "roc_auc": (s["metrics"]["roc_auc"], g["roc_auc"]) if "roc_auc" in g else None,
            "rows": {k: v for k, v in (s.get("validation") or {}).items() if k == "rows"}}


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--only", help="comma-separated datasets (default: " + ",".join(BUNDLED + SHAPES + DATED) + ")")
    ap.add_argument("--workdir", type=Path, help="keep the projects here (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else [*BUNDLED, *SHAPES, *DATED]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trainflow-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for name in names:
            r = measure(work, name)
            rows.append(r)
            print(f"{name}: {json.dumps(r)}", file=sys.stderr, flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    table(["dataset", "metric", "trainflow", "GBDT", "gap (GBDT - trainflow)", "ROC AUC trainflow / GBDT",
           "trainflow train s", "GBDT fit s (1 thread)"],
          [[r["dataset"], r["metric"], f"{r['candidate']:.4f}", f"{r['gbdt']:.4f}", f"{r['gap']:+.4f}",
            "-" if r["roc_auc"] is None else f"{r['roc_auc'][0]:.4f} / {r['roc_auc'][1]:.4f}",
            f"{r['train_s']:.1f}", f"{r['gbdt_fit_s']:.2f}"] for r in rows], ["---"] * 2 + ["---:"] * 6)
    print(f"worst_gap_to_gbdt={max(r['gap'] for r in rows):.4f}")


if __name__ == "__main__":
    main()
