"""Does validation of a table far larger than one batch keep its memory bounded?

    .venv/bin/python benchmarks/validation_memory.py --rows 1M,4M --workdir /tmp/vm   # a few minutes
    .venv/bin/python benchmarks/validation_memory.py --rows 20M --workdir /tmp/vm     # the issue's figure

Per size, :func:`generate` writes a table, then ``run_plan`` validates it batch by batch in a fresh
subprocess that reports its own peak RSS and seconds. Last line: ``validation_rss_mb=<peak MB at the
largest size> validation_s=<its seconds> rss_growth=<peak at largest / peak at smallest>``.
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

from common import ROOT, parse_rows, parser

from core.env import TELEMETRY_OFF
from core.paths import python_path_with

# Run in the child: validate, then report this process's peak RSS (Linux: KiB) and seconds.
CHILD = """
import json, resource, sys, time
from pathlib import Path
from core.config import DatasetConfig
from core.expectations import load_expectations
from tasks.base import ValidationPlan
from validation.gx_run import run_plan
root, batch_rows = Path(sys.argv[1]), int(sys.argv[2])
exp = load_expectations(root / "expectations.yaml")
cfg = DatasetConfig(path="data", train_file="train", test_file="test", label="label")
params = {"dataset": cfg, "root": root, "seed": 0, "stratify": True, "expectations": exp,
          "features": [c.name for c in exp.columns if c.name != "label"], "label": "label",
          "class_label": True, "batch_rows": batch_rows}
t = time.perf_counter()
plan = ValidationPlan("validation.suite", [root / "data/train", root / "data/test"], params)
report = run_plan(plan, root / "report")
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"seconds": time.perf_counter() - t, "peak_rss_mb": peak_mb,
                  "success": report["success"], "rows": report["rows"], "n_failed": report["n_failed"]}))
"""


def generate(root: Path, rows: int, cols: int, rows_per_file: int = 1 << 20, row_group: int = 1 << 17) -> None:
    """``root/data/{train,test}/part-*.parquet`` (test: rows // 10) and ``root/expectations.yaml``,
    written a file at a time (memory: one file's columns)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f"f{i}" for i in range(cols)]
    rng = np.random.default_rng(0)
    for split, n in (("train", rows), ("test", max(rows // 10, 1))):
        folder = root / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, start in enumerate(range(0, n, rows_per_file)):
            m = min(rows_per_file, n - start)
            arrays = [pa.array(rng.random(m)) for _ in names] + [pa.array(rng.integers(0, 4, m))]
            pq.write_table(pa.Table.from_arrays(arrays, names=[*names, "label"]), folder / f"part-{i:04d}.parquet",
                           row_group_size=row_group)
    lines = ["label: label", "class_share: [0.2, 0.3]", "columns:"]
    lines += [f"  - {{name: {c}, type: float, min: 0, max: 1}}" for c in names]
    lines += ["  - {name: label, type: integer, values: [0, 1, 2, 3]}"]
    (root / "expectations.yaml").write_text("\n".join(lines) + "\n")


def measure_validation(root: Path, batch_rows: int) -> dict:
    """Validate the table under ``root`` (:func:`generate`'s layout) in a fresh subprocess:
    ``{"seconds", "peak_rss_mb", "success", "rows", "n_failed"}`` (RSS of that process alone)."""
    env = {**os.environ, **TELEMETRY_OFF, "PYTHONPATH": python_path_with(ROOT, os.environ.get("PYTHONPATH"))}
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(batch_rows)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"validation failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rows", default="1M,4M", help="train rows per table, comma-separated (k/M suffixes)")
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--batch-rows", type=int, default=65536)
    ap.add_argument("--workdir", type=Path, help="where the tables go; default: a temporary folder")
    ap.add_argument("--keep", action="store_true", help="leave the generated tables in --workdir")
    args = ap.parse_args(argv)
    sizes = [parse_rows(r) for r in args.rows.split(",")]
    base = Path(args.workdir or tempfile.mkdtemp(prefix="validation-memory-"))
    results = []
    for rows in sizes:
        root = base / f"rows-{rows}"
        t = time.perf_counter()
        generate(root, rows, args.cols)
        gen_s = time.perf_counter() - t
        r = measure_validation(root, args.batch_rows)
        results.append(r)
        print(f"rows={rows} cols={args.cols} generate_s={gen_s:.1f} validate_s={r['seconds']:.1f} "
              f"peak_rss_mb={r['peak_rss_mb']:.0f} success={r['success']} n_failed={r['n_failed']}", flush=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    last = results[-1]
    print(f"validation_rss_mb={last['peak_rss_mb']:.0f} validation_s={last['seconds']:.1f} "
          f"rss_growth={last['peak_rss_mb'] / results[0]['peak_rss_mb']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
