"""How the cost grows with the data: validation, one streamed epoch and peak memory per size.

    .venv/bin/python benchmarks/data_scale.py                        # 1M, 5M and 20M rows x 32 columns
    .venv/bin/python benchmarks/data_scale.py --sizes 50k,200k        # a quick look (a shared machine)

Per size it writes a Parquet table under ``--workdir`` (default a temporary folder it removes), then,
each in its own process: the pipeline's validation and one epoch of the regression MLP with the
streamed loader under real torchrun. On the smallest size the in-memory and streamed epochs
alternate ``--repeats`` times, best of each side by side.

Last line: ``rss_growth=x time_growth=y``: the largest worker peak RSS at the largest size over that
at the smallest, and the epoch seconds at the largest size over (rows ratio x those at the smallest).
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

import numpy as np

from common import ROOT, parse_rows, parser

from core.env import TELEMETRY_OFF
from core.paths import python_path_with

TEST_ROWS = 20_000
SEGMENTS = 50  # values of the string feature (a categorical column with an effect on the target)


def write_table(path: Path, rows: int, cols: int, row_group: int, seed: int) -> None:
    """``rows`` x ``cols`` float32 features, the string ``segment`` and a float target, one row group
    at a time (bounded memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    fixed = np.random.default_rng(12345)  # the same function for every split
    w = fixed.normal(size=cols).astype(np.float32)
    effect = fixed.normal(size=SEGMENTS).astype(np.float32)
    segments = np.array([f"segment-{i:02d}" for i in range(SEGMENTS)], dtype=object)
    names = [f"f{j:02d}" for j in range(cols)]
    schema = pa.schema([*(pa.field(n, pa.float32()) for n in names), pa.field("segment", pa.string()),
                        pa.field("target", pa.float32())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, row_group):
            n = min(row_group, rows - start)
            x = rng.normal(size=(n, cols)).astype(np.float32)
            seg = rng.integers(0, SEGMENTS, n)
            y = (x @ w + effect[seg] + 0.1 * rng.normal(size=n)).astype(np.float32)
            table = pa.Table.from_arrays([*(x[:, j] for j in range(cols)), pa.array(segments[seg], pa.string()), y],
                                         schema=schema)
            writer.write_table(table, row_group_size=row_group)


def write_dataset(folder: Path, rows: int, cols: int, row_group: int) -> None:
    data = folder / "data"
    data.mkdir(parents=True, exist_ok=True)
    write_table(data / "train.parquet", rows, cols, row_group, seed=1)
    write_table(data / "test.parquet", TEST_ROWS, cols, row_group, seed=2)
    lines = ["version: 1", "label: target", f"rows: {{train: [1, {10 * rows}], test: [1, {10 * TEST_ROWS}]}}",
             "columns:"]
    lines += [f"  - {{name: f{j:02d}, type: float, nulls: false}}" for j in range(cols)]
    lines += ["  - {name: segment, type: string, nulls: false}", "  - {name: target, type: float, nulls: false}"]
    (data / "expectations.yaml").write_text("\n".join(lines) + "\n")


def write_config(folder: Path, loader: str, batch: int) -> Path:
    cfg = folder / f"config-{loader}.yaml"
    cfg.write_text(f"""name: data-scale
task: regression
seed: 0
dataset: {{path: data, dvc_file: data.dvc, train_file: train.parquet, test_file: test.parquet, label: target,
          val_fraction: 0.01, expectations_file: data/expectations.yaml}}
model: {{kind: mlp, hidden: 64, dropout: 0.0}}
training: {{strategy: ddp, cpu_workers: 2, threads_per_worker: 1, epochs: 1, batch_size: {batch}, warmup_epochs: 0,
           checkpoints: false, timeout_s: 7200, loader: {{kind: {loader}, val_rows: 20000}}}}
""")
    return cfg


def measured(cmd: list[str], env: dict, cwd: Path) -> tuple[float, int]:
    """(wall seconds, the process's own peak RSS in bytes); raises on a non-zero exit."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall, rc = time.perf_counter() - t0, os.waitstatus_to_exitcode(status)
        proc.returncode = rc  # reaped here: Popen must not wait for it again
        if rc:
            log.seek(0)
            raise SystemExit(f"{' '.join(map(str, cmd))} exited {rc}:\n{log.read().decode(errors='replace')[-4000:]}")
    return wall, usage.ru_maxrss * 1024


VALIDATE = """
import sys
from pathlib import Path
from core.config import load_config
from tasks import get_task
from validation.gx_run import run_plan
cfg = load_config(sys.argv[1])
root = Path(sys.argv[2])
report = run_plan(get_task(cfg.task).validation_plan(cfg, root), root / "validation")
print("VALIDATION", report.get("success"))
"""


def train(folder: Path, cfg: Path, env: dict, name: str) -> dict:
    out = folder / f"out-{name}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "training.worker", "--config", str(cfg), "--out", str(out), "--root", str(folder),
           "--data-md5", "0" * 32]
    wall = measured(cmd, env, ROOT)[0]
    result = json.loads((out / "result.json").read_text())
    epoch = result["history"][0]
    return {"job_s": wall, "epoch_s": epoch["epoch_time_s"], "samples_per_s": epoch["samples_per_s"],
            "worker_rss": [r["peak_mem_mb"] * 2**20 for r in result["ranks"]], "val_loss": epoch["val_loss"]}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default="1M,5M,20M", help="rows per table, comma-separated (k/M suffixes)")
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--row-group", type=int, default=131072, help="rows per Parquet row group")
    ap.add_argument("--batch", type=int, default=512, help="per-worker batch")
    ap.add_argument("--workdir", type=Path, help="where the tables go (kept); default: a temporary folder")
    ap.add_argument("--skip-validation", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="alternating in-memory/streamed epochs on the smallest size")
    args = ap.parse_args(argv)
    sizes = sorted(parse_rows(s) for s in args.sizes.split(","))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="trainflow-data-scale-"))
    env = {**os.environ, **TELEMETRY_OFF, "PYTHONPATH": python_path_with(ROOT, os.environ.get("PYTHONPATH")), "OMP_NUM_THREADS": "1",
           "TRAINFLOW_HOME": str(work / "home")}
    rows_out = {}
    try:
        print(f"{'rows':>10} {'gen_s':>6} {'valid_s':>8} {'valid_rss_mb':>12} {'epoch_s':>8} {'samples/s':>10} "
              f"{'worker_rss_mb':>14} {'val_loss':>9}", flush=True)
        for rows in sizes:
            folder = work / f"rows-{rows}"
            t0 = time.perf_counter()
            write_dataset(folder, rows, args.cols, args.row_group)
            gen = time.perf_counter() - t0
            stream_cfg = write_config(folder, "stream", args.batch)
            v_s, v_rss = (0.0, 0) if args.skip_validation else measured([sys.executable, "-c", VALIDATE, str(stream_cfg), str(folder)], env, ROOT)
            r = train(folder, stream_cfg, env, "stream")
            r.update(rows=rows, valid_s=v_s, valid_rss=v_rss, folder=folder)
            rows_out[rows] = r
            print(f"{rows:>10} {gen:>6.1f} {v_s:>8.1f} {v_rss / 2**20:>12.0f} {r['epoch_s']:>8.2f} "
                  f"{r['samples_per_s']:>10.0f} {'/'.join(f'{m / 2**20:.0f}' for m in r['worker_rss']):>14} "
                  f"{r['val_loss']:>9.4f}", flush=True)
        small, large = rows_out[sizes[0]], rows_out[sizes[-1]]
        # Side by side on the smallest size: streamed and in-memory epochs alternate, best of each.
        folder = small["folder"]
        configs = {k: write_config(folder, k, args.batch) for k in ("stream", "memory")}
        best = {"stream": [small], "memory": []}
        for _ in range(args.repeats):
            for kind in ("memory", "stream"):
                best[kind].append(train(folder, configs[kind], env, kind))
        sps = {k: max(r["samples_per_s"] for r in runs) for k, runs in best.items()}
        mem_rss = max(m for r in best["memory"] for m in r["worker_rss"])
        print(f"at {sizes[0]} rows, best of {args.repeats} alternating runs: in-memory {sps['memory']:.0f} "
              f"samples/s (worker peak RSS {mem_rss / 2**20:.0f} MB), streamed {sps['stream']:.0f}; "
              f"streamed/in-memory {sps['stream'] / sps['memory']:.2f}x")
        rss_growth = max(large["worker_rss"]) / max(small["worker_rss"])
        time_growth = large["epoch_s"] / (large["rows"] / small["rows"] * small["epoch_s"])
        print(f"rss_growth={rss_growth:.2f} time_growth={time_growth:.2f}")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
