"""The scaling sweep: train one config under several process/thread layouts and batch sizes
(``training.probe.measure``), and say which layout to use (``trainflow scale``). ``scaling_efficiency``
is a row's samples/s / (1 process x 1 thread's at the same batch size x cores used; GPUs: 1 GPU's, per GPU).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from prefect import flow

from core.config import load_config
from core.paths import project_root, trainflow_home
from training import plan


def run_sweep(cfg_path: str | Path, overrides: list[str] = (), layouts: list[dict] | None = None,
              batch_sizes: list[int] | None = None, epochs: int = 3, target_accuracy: float = 0.95,
              out_dir: str | Path | None = None, log=print) -> dict:
    """Train ``cfg_path`` once per layout x batch size (no Prefect, no MLflow, checkpoints off); write
    scale.json/.md/.png into ``out_dir`` and the rows where ``training.cpu_workers: auto`` finds them."""
    from core.manifest import read_dvc_file
    from training.probe import default_layouts, measure

    cfg_path = Path(cfg_path).resolve()
    root = project_root(cfg_path)
    home = trainflow_home(root)
    base = load_config(cfg_path, list(overrides))
    key = plan.layout_key(base)
    out = Path(out_dir) if out_dir else home / "scale" / key
    out.mkdir(parents=True, exist_ok=True)
    layouts = layouts or default_layouts()
    batch_sizes = list(batch_sizes or [base.training.batch_size])
    t0 = time.perf_counter()
    rows = measure(base, layouts, batch_sizes, epochs, root, read_dvc_file(root, base.dataset.dvc_file).md5,
                   out / "runs", target_accuracy, log)
    for row in rows:  # against 1 process x 1 thread at the same batch size
        one = next((r for r in rows if r["nproc"] == 1 and r["threads"] == 1 and r["device"] == row["device"]
                    and r["batch_size"] == row["batch_size"] and r["samples_per_s"]), None)
        if one and row["samples_per_s"]:
            row["scaling_efficiency"] = row["samples_per_s"] / (one["samples_per_s"] * row["cores"])
    ok = [r for r in rows if r["samples_per_s"]]
    best = plan.choose_layout(ok) if ok else None
    report = {
        "config": str(cfg_path), "config_name": base.name, "layout_key": key, "overrides": list(overrides),
        "epochs": epochs, "target_accuracy": target_accuracy, "batch_sizes": batch_sizes,
        "machine": {"cpu_count": os.cpu_count(), "gpus": sum(1 for l in layouts if l["device"] == "cuda")},
        "sweep_wall_s": time.perf_counter() - t0,
        "rows": rows, "best": best, "recommendation": plan.recommendation(rows),
    }
    (out / "scale.json").write_text(json.dumps(report, indent=2))
    (out / "scale.md").write_text(markdown(report))
    plot(report, out / "scale.png")
    saved = plan.save_sweep(home, base, rows, config=str(cfg_path), layout_key=key, target_accuracy=target_accuracy,
                            epochs=epochs)
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
    labels = [f"{plan.describe(r)}\nbatch {r['batch_size']}" for r in rows]
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

