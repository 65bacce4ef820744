"""The short probe ``cpu_workers: auto`` runs when no ``trainflow scale`` sweep exists.

A rule cannot know this machine: on a quiet 2-core box one process with 2 intra-op
threads beats 2 DDP processes for small models, while on a busy one the 2-thread process
collapses (its OpenMP threads wait on each other) and 2 processes win by 10x or more
(BENCHMARKS.md). So the first ``auto`` run of a config measures instead: one epoch of
each CPU layout (1 process x all cores, 1 x 1, all cores x 1 thread), checkpoints and
metrics off, each a real torchrun job. The rows are saved where a sweep's are
(``advisor.sweep_path``), marked ``source: probe``, so later runs reuse them and
``trainflow scale`` (a fuller measurement) replaces them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from core.config import PipelineConfig, config_from_dict
from core.errors import TrainflowError


def cpu_layouts(cores: int) -> list[dict]:
    """1 x cores, 1 x 1, cores x 1 (duplicates dropped on 1 core)."""
    out: list[dict] = []
    for n, t in ((1, cores), (1, 1), (cores, 1)):
        if not any(l["nproc"] == n and l["threads"] == t for l in out):
            out.append({"layout": f"{n}x{t}", "nproc": n, "threads": t})
    return out


def _job_config(cfg: PipelineConfig, nproc: int, threads: int) -> PipelineConfig:
    data = cfg.model_dump(mode="json")
    data["training"].update(cpu_workers=nproc, threads_per_worker=threads, backend="gloo",
                            strategy="single" if nproc == 1 else "ddp", epochs=1,
                            checkpoints=False, metrics=False)
    return config_from_dict(data)


def probe_layouts(cfg: PipelineConfig, root: Path, data_md5: str, save_to: Path | None = None,
                  cores: int | None = None, log: Callable[[str], None] = lambda _m: None) -> list[dict]:
    """Train one epoch per CPU layout; return sweep-shaped rows (and save them to ``save_to``)."""
    from training.launcher import make_spec, run_job

    cores = cores or os.cpu_count() or 1
    rows: list[dict] = []
    tmp = Path(tempfile.mkdtemp(prefix="trainflow-probe-"))
    try:
        for lay in cpu_layouts(cores):
            row = {**lay, "device": "cpu", "cores": lay["nproc"] * lay["threads"],
                   "batch_size": cfg.training.batch_size, "time_to_target_s": None, "source": "probe"}
            try:
                job = _job_config(cfg, lay["nproc"], lay["threads"])
                result = run_job(make_spec(job, tmp / lay["layout"], root, data_md5, nproc=lay["nproc"]))
                row.update(samples_per_s=float(result.get("samples_per_s") or 0.0), status=result.get("status"))
            except TrainflowError as exc:  # a layout that fails is not a candidate
                row.update(samples_per_s=0.0, status="failed", error=str(exc))
            log(f"probe: {lay['nproc']} process(es) x {lay['threads']} thread(s): "
                f"{row['samples_per_s']:,.0f} samples/s")
            rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if save_to is not None and any(r["samples_per_s"] for r in rows):
        save_to.parent.mkdir(parents=True, exist_ok=True)
        save_to.write_text(json.dumps({"source": "probe", "epochs": 1, "rows": rows}, indent=2))
    return rows
