"""Measuring layouts, one real torchrun job per process/thread layout (and batch size): what
``trainflow scale`` is asked, and the probe (``measured_plan``) a ``cpu_workers: auto`` plan asks
for when nothing was measured for its config (no rule knows how busy this machine is). A row's
``samples_per_s`` is the mean over epochs of global training samples/s; ``time_to_target_s`` sums
``epoch_time_s`` until ``val_accuracy`` first reaches the target; ``cost_core_s`` is that x cores."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

from core.config import PipelineConfig, config_from_dict
from core.errors import TrainflowError
from training.plan import HostFacts, LaunchPlan, describe, plan_launch, save_sweep, valid_rows


def default_layouts(gpus: bool = True) -> list[dict]:
    """CUDA (``gpus``): 1..n GPUs; else 1 process x all cores, 1 x 1, N processes x 1 thread
    (N = cores), duplicates dropped."""
    if gpus:
        import torch

        if n_gpus := torch.cuda.device_count() if torch.cuda.is_available() else 0:
            return [{"name": f"{n}gpu", "nproc": n, "threads": 1, "device": "cuda"} for n in range(1, n_gpus + 1)]
    cores = os.cpu_count() or 1
    return [{"name": f"{n}x{t}", "nproc": n, "threads": t, "device": "cpu"}
            for n, t in dict.fromkeys(((1, cores), (1, 1), (cores, 1)))]


def parse_layout(text: str) -> dict:
    """``2x1`` -> 2 processes x 1 thread (CPU); ``2gpu`` -> 2 GPUs."""
    text = text.strip().lower()
    if text.endswith("gpu"):
        return {"name": text, "nproc": int(text[:-3]), "threads": 1, "device": "cuda"}
    n, sep, t = text.partition("x")
    if not sep or not n.isdigit() or not t.isdigit() or int(n) < 1 or int(t) < 1:
        raise TrainflowError(f"layout {text!r}: expected PROCSxTHREADS (e.g. 1x2) or NGPU (e.g. 2gpu)")
    return {"name": text, "nproc": int(n), "threads": int(t), "device": "cpu"}


def _row(layout: dict, batch: int, result: dict, target: float | None) -> dict:
    cores = layout["nproc"] * (1 if layout["device"] == "cuda" else layout["threads"])
    ttt = epoch = None  # training seconds until val_accuracy first reaches ``target``, and that epoch
    total = 0.0
    for h in result.get("history", []) if target is not None else ():
        total += float(h["epoch_time_s"])
        if float(h["val_accuracy"]) >= target:
            ttt, epoch = total, int(h["epoch"])
            break
    ranks = result.get("ranks") or [{}]
    return {
        "layout": layout["name"], "device": layout["device"], "nproc": layout["nproc"],
        "threads": layout["threads"], "cores": cores, "batch_size": batch,
        "global_batch": result.get("global_batch"), "strategy": result.get("strategy"),
        "status": result.get("status"), "epochs_run": result.get("epochs_run"),
        "samples_per_s": float(result.get("samples_per_s") or 0.0),
        "time_to_target_s": ttt, "target_epoch": epoch,
        "cost_core_s": None if ttt is None else ttt * cores,
        "final_val_accuracy": (result.get("final") or {}).get("val_accuracy"),
        "train_wall_s": result.get("train_wall_s"), "job_wall_s": result.get("wall_s"),
        "peak_mem_mb": max((r.get("peak_mem_mb") or 0.0) for r in ranks),
        "state_bytes_per_rank": max((r.get("param_bytes", 0) + r.get("grad_bytes", 0) + r.get("optim_bytes", 0))
                                    for r in ranks),
        "scaling_efficiency": None,
        "error": None,
    }


def measure(cfg: PipelineConfig, layouts: list[dict], batch_sizes: list[int], epochs: int, root: Path,
            data_md5: str, runs_dir: Path, target: float | None = None, log: Callable[[str], None] = print,
            **training) -> list[dict]:
    """Train ``cfg`` once per layout x batch size in ``runs_dir`` (checkpoints off, ``training``'s
    keys set); one row each. A layout that fails is a finding (its row has ``error``), not the end
    of the measuring."""
    from training.launcher import launch

    rows: list[dict] = []
    for layout in layouts:
        n, threads, cpu = layout["nproc"], layout["threads"], layout["device"] == "cpu"
        for batch in batch_sizes:
            data = cfg.model_dump(mode="json")
            data["training"].update(cpu_workers=n, threads_per_worker=threads, strategy="single" if n == 1 else "ddp",
                                    batch_size=batch, epochs=epochs, checkpoints=False, **training,
                                    **({"backend": "gloo"} if cpu else {}))  # a CPU layout stays on CPU
            run_dir = runs_dir / f"{layout['name']}-b{batch}"
            shutil.rmtree(run_dir, ignore_errors=True)
            log(f"scale: {describe(layout)}, batch {batch}, {epochs} epoch(s) ...")
            try:
                plan = plan_launch(config_from_dict(data), HostFacts(gpus=0 if cpu else n))
                row = _row(layout, batch, launch(plan, run_dir, root, data_md5).finish(), target)
            except TrainflowError as exc:
                row = {**_row(layout, batch, {}, None), "status": "failed", "error": str(exc)}
            ttt = row["time_to_target_s"]
            log(f"scale:   failed: {row['error']}" if row.get("error") else f"scale:   {row['samples_per_s']:,.0f} "
                "samples/s, time to target " + ("not reached" if ttt is None else f"{ttt:.2f} s"))
            rows.append(row)
    return rows


def measured_plan(plan: LaunchPlan, root: Path, data_md5: str, home: Path, log: Callable[[str], None] = print) -> LaunchPlan:
    """The probe: one epoch of each CPU layout of this host for the plan's config as given (metrics
    off), saved where ``plan.load_sweep`` finds them (``source: probe``); then the plan made again
    from what was measured."""
    cfg = plan.unmeasured
    with tempfile.TemporaryDirectory(prefix="trainflow-probe-", ignore_cleanup_errors=True) as tmp:
        rows = measure(cfg, default_layouts(gpus=False), [cfg.training.batch_size], 1, root, data_md5, Path(tmp),
                       log=log, metrics=False)
    rows = [{**r, "source": "probe"} for r in rows]
    if valid_rows(rows):
        save_sweep(home, cfg, rows, source="probe", epochs=1)
    return plan_launch(cfg, replace(plan.facts, sweep=rows))
