"""The short probe ``cpu_workers: auto`` runs when no ``trainflow scale`` sweep exists: no rule
knows how busy this machine is, so one epoch of each CPU layout is measured, each a real torchrun
job, and saved where a sweep's rows are (``advisor.sweep_path``), marked ``source: probe``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from core.config import PipelineConfig, config_from_dict
from core.errors import TrainflowError


def cpu_layouts(cores: int) -> list[dict]:
    """1 x cores, 1 x 1, cores x 1 (duplicates dropped on 1 core)."""
    pairs = dict.fromkeys(((1, cores), (1, 1), (cores, 1)))
    return [{"layout": f"{n}x{t}", "nproc": n, "threads": t} for n, t in pairs]


def probe_layouts(cfg: PipelineConfig, root: Path, data_md5: str, save_to: Path) -> list[dict]:
    """Train one epoch per CPU layout; return sweep-shaped rows (saved to ``save_to`` when any trained)."""
    from training.launcher import make_spec, run_job

    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="trainflow-probe-", ignore_cleanup_errors=True) as tmp:
        for lay in cpu_layouts(os.cpu_count() or 1):
            n, threads = lay["nproc"], lay["threads"]
            row = {**lay, "device": "cpu", "cores": n * threads, "batch_size": cfg.training.batch_size,
                   "time_to_target_s": None, "source": "probe"}
            data = cfg.model_dump(mode="json")
            data["training"].update(cpu_workers=n, threads_per_worker=threads, backend="gloo",
                                    strategy="single" if n == 1 else "ddp", epochs=1, checkpoints=False, metrics=False)
            try:
                result = run_job(make_spec(config_from_dict(data), Path(tmp, lay["layout"]), root, data_md5, nproc=n))
                row.update(samples_per_s=float(result.get("samples_per_s") or 0.0), status=result.get("status"))
            except TrainflowError as exc:  # a layout that fails is not a candidate
                row.update(samples_per_s=0.0, status="failed", error=str(exc))
            rows.append(row)
    if any(r["samples_per_s"] for r in rows):
        save_to.parent.mkdir(parents=True, exist_ok=True)
        save_to.write_text(json.dumps({"source": "probe", "epochs": 1, "rows": rows}, indent=2))
    return rows
