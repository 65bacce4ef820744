"""The scaling sweep: train one config under several process/thread layouts and batch sizes, measure,
and say which layout to use (``trainflow scale``).

Per row: ``samples_per_s`` is the mean over epochs of global training samples/s; ``scaling_efficiency``
is that / (1 process x 1 thread's at the same batch size x cores used; GPUs: 1 GPU's, per GPU);
``time_to_target_s`` sums ``epoch_time_s`` up to the first epoch whose ``val_accuracy`` reaches the
target; ``cost_core_s`` is that x cores (GPUs) used.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from prefect import flow

from core.config import load_config
from core.errors import TrainflowError
from core.paths import project_root, trainflow_home
from training import advisor


def default_layouts() -> list[dict]:
    """CPU: 1 process x all cores, 1 x 1, N processes x 1 thread (N = cores), duplicates dropped.
    CUDA: 1..n GPUs."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return [{"name": f"{n}gpu", "nproc": n, "threads": 1, "device": "cuda"} for n in range(1, gpus + 1)]
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


def _row(layout: dict, batch: int, result: dict, target: float) -> dict:
    cores = layout["nproc"] * (1 if layout["device"] == "cuda" else layout["threads"])
    ttt = epoch = None  # training seconds until val_accuracy first reaches ``target``, and that epoch
    total = 0.0
    for h in result.get("history", []):
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


def run_sweep(cfg_path: str | Path, overrides: list[str] = (), layouts: list[dict] | None = None,
              batch_sizes: list[int] | None = None, epochs: int = 3, target_accuracy: float = 0.95,
              out_dir: str | Path | None = None, log=print) -> dict:
    """Train ``cfg_path`` once per layout x batch size (no Prefect, no MLflow, checkpoints off); write
    scale.json/.md/.png into ``out_dir`` and the rows where ``training.cpu_workers: auto`` finds them."""
    from core.manifest import read_dvc_file
    from training.launcher import make_spec, run_job

    cfg_path = Path(cfg_path).resolve()
    root = project_root(cfg_path)
    home = trainflow_home(root)
    base = load_config(cfg_path, list(overrides))
    key = advisor.layout_key(base)
    out = Path(out_dir) if out_dir else home / "scale" / key
    out.mkdir(parents=True, exist_ok=True)
    layouts = layouts or default_layouts()
    batch_sizes = list(batch_sizes or [base.training.batch_size])
    data_md5 = read_dvc_file(root, base.dataset.dvc_file).md5
    rows: list[dict] = []
    t0 = time.perf_counter()
    for layout in layouts:
        for batch in batch_sizes:
            n = layout["nproc"]
            job = [*overrides, f"training.cpu_workers={n}", f"training.threads_per_worker={layout['threads']}",
                   f"training.strategy={'single' if n == 1 else 'ddp'}", f"training.batch_size={batch}",
                   f"training.epochs={epochs}", "training.checkpoints=false"]
            if layout["device"] == "cpu":
                job.append("training.backend=gloo")  # a CPU layout stays on CPU even on a GPU host
            run_dir = out / "runs" / f"{layout['name']}-b{batch}"
            shutil.rmtree(run_dir, ignore_errors=True)
            log(f"scale: {advisor.describe(layout)}, batch {batch}, {epochs} epoch(s) ...")
            try:
                cfg = load_config(cfg_path, job)
                result = run_job(make_spec(cfg, run_dir, root, data_md5, nproc=n))
                row = _row(layout, batch, result, target_accuracy)
            except TrainflowError as exc:  # one failed layout is a finding, not the end of the sweep
                row = {"layout": layout["name"], "device": layout["device"], "nproc": n,
                       "threads": layout["threads"], "cores": n * layout["threads"], "batch_size": batch,
                       "samples_per_s": 0.0, "time_to_target_s": None, "cost_core_s": None,
                       "scaling_efficiency": None, "status": "failed", "error": str(exc)}
            ttt = row["time_to_target_s"]
            log(f"scale:   failed: {row['error']}" if row.get("error") else f"scale:   {row['samples_per_s']:,.0f} "
                f"samples/s, time to target " + ("not reached" if ttt is None else f"{ttt:.2f} s"))
            rows.append(row)
    for row in rows:  # against 1 process x 1 thread at the same batch size
        one = next((r for r in rows if r["nproc"] == 1 and r["threads"] == 1 and r["device"] == row["device"]
                    and r["batch_size"] == row["batch_size"] and r["samples_per_s"]), None)
        if one and row["samples_per_s"]:
            row["scaling_efficiency"] = row["samples_per_s"] / (one["samples_per_s"] * row["cores"])
    ok = [r for r in rows if r["samples_per_s"]]
    best = advisor.choose_layout(ok) if ok else None
    report = {
        "config": str(cfg_path), "config_name": base.name, "layout_key": key, "overrides": list(overrides),
        "epochs": epochs, "target_accuracy": target_accuracy, "batch_sizes": batch_sizes,
        "machine": {"cpu_count": os.cpu_count(), "gpus": sum(1 for l in layouts if l["device"] == "cuda")},
        "sweep_wall_s": time.perf_counter() - t0,
        "rows": rows, "best": best, "recommendation": advisor.recommendation(rows),
    }
    (out / "scale.json").write_text(json.dumps(report, indent=2))
    (out / "scale.md").write_text(markdown(report))
    plot(report, out / "scale.png")
    saved = advisor.sweep_path(home, base)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps({"config": str(cfg_path), "layout_key": key, "rows": rows,
                                 "target_accuracy": target_accuracy, "epochs": epochs}, indent=2))
    report["files"] = {**{k: str(out / f"scale.{k}") for k in ("json", "md", "png")}, "saved_rows": str(saved)}
    return report


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def markdown(report: dict) -> str:
    lines = [
        f"# Scaling sweep: {report['config_name']}",
        "",
        f"{report['epochs']} epoch(s) per job, target val accuracy {report['target_accuracy']}, "
        f"{report['machine']['cpu_count']} CPU core(s). Time to target = training time of the epochs "
        "until the target was first reached (no start-up, no validation).",
        "",
        "| layout | procs | threads | batch | samples/s | efficiency | time to target (s) | cost (core·s) | final val acc |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        cells = (f"failed: {r['error'][:80]} | | | |" if r.get("error") else
                 f"{r['samples_per_s']:,.0f} | {_fmt(r['scaling_efficiency'], '.2f')} | "
                 f"{_fmt(r['time_to_target_s'], '.2f')} | {_fmt(r['cost_core_s'], '.2f')} | "
                 f"{_fmt(r.get('final_val_accuracy'), '.4f')}")
        lines.append(f"| {r['layout']} | {r['nproc']} | {r['threads']} | {r['batch_size']} | {cells} |")
    lines += ["", f"**Recommendation:** {report['recommendation']}", ""]
    if report.get("best"):
        lines.append(f"Best: {report['best']['reason']}.")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = [f"{advisor.describe(r)}\nbatch {r['batch_size']}" for r in rows]
    values = [r["samples_per_s"] for r in rows]
    best = report.get("best")
    colors = ["tab:green" if best and r["layout"] == best["layout"] and r["batch_size"] == best["batch_size"]
              else "tab:blue" for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.8 * len(rows)), 4.0))
    bars = ax.bar(range(len(rows)), values, color=colors)
    for bar, r in zip(bars, rows):
        note = "failed" if r.get("error") else (
            f"{r['samples_per_s']:,.0f}/s\neff {_fmt(r['scaling_efficiency'], '.2f')}\n"
            f"ttt {_fmt(r['time_to_target_s'], '.1f', 'n/a')}" + ("" if r["time_to_target_s"] is None else " s"))
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("training samples/s")
    ax.set_ylim(0, max(values + [1.0]) * 1.35)
    ax.set_title(f"{report['config_name']}: throughput per layout (green: recommended)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@flow(name="scale")
def scale_flow(cfg_path: str, overrides: list[str] | None = None, layouts: list[dict] | None = None,
                batch_sizes: list[int] | None = None, epochs: int = 3, target_accuracy: float = 0.95,
                out_dir: str | None = None) -> dict:
    """run_sweep, then log the report files and per-row metrics to MLflow (experiment
    ``<registry.experiment>-scale``) and a markdown artifact."""
    from prefect import get_run_logger
    from prefect.artifacts import create_markdown_artifact

    from core.env import apply_offline_env
    from core.paths import tracking_uri
    from registry import store

    logger = get_run_logger()
    report = run_sweep(cfg_path, overrides or [], layouts, batch_sizes, epochs, target_accuracy, out_dir,
                       log=logger.info)
    root = project_root(Path(cfg_path).resolve())
    home = trainflow_home(root)
    apply_offline_env(home)
    cfg = load_config(cfg_path, overrides or [])
    exp_id = store.configure(tracking_uri(home), f"{cfg.registry.experiment}-scale", home / "mlartifacts")
    run_id = store.start_run(exp_id, f"{cfg.name}-scale-{report['layout_key']}",
                             {"trainflow.stage": "scale", "layout_key": report["layout_key"]})
    try:
        for r in report["rows"]:
            name = "".join(c if c.isalnum() else "_" for c in f"{r['layout']}_b{r['batch_size']}")
            store.log_metrics(run_id, {f"{name}/{k}": r[k] for k in
                                       ("samples_per_s", "scaling_efficiency", "time_to_target_s", "cost_core_s")
                                       if r.get(k) is not None})
        for f in ("json", "md", "png"):
            store.log_file(run_id, Path(report["files"][f]), "scale")
        store.end_run(run_id)
    except BaseException:
        store.end_run(run_id, "FAILED")
        raise
    report["mlflow_run_id"] = run_id
    create_markdown_artifact(markdown=Path(report["files"]["md"]).read_text(), key="scale-report",
                             description="trainflow scaling sweep")
    logger.info("recommendation: %s", report["recommendation"])
    return report

