"""Worker entry point: one process of a torchrun job (or a plain single process).

    torchrun --nproc-per-node 2 -m training.worker --config configs/digits.yaml --out out/run1

Rank 0 writes ``weights.pt``, ``model.pt2`` and ``result.json`` into ``--out``; a rerun with the
same ``--out`` resumes from the latest checkpoint in ``--out/checkpoints``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from core.config import PipelineConfig, load_config
from core.errors import TrainflowError
from core.manifest import read_dvc_file
from core.paths import importable_root, project_root
from tasks import task_for
from tasks.splits import Splits
from training import multinode
from training.agent import bind_worker
from training.data import load_splits
from training.distributed import process_group
from training.export import export_model
from training.launcher import SCORE_ENV, await_stop_after_fatal, write_fatal
from training.sink import MetricsSink
from training.trainer import FitResult, Trainer, restart_count, state_dict_sha256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="training.worker", description="Train one config (run under torchrun).")
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--root", type=Path, help="project root for dataset paths (default: the config's DVC repo)")
    ap.add_argument("--data-md5", help="data version recorded in checkpoints (default: read from the DVC file)")
    ap.add_argument("--force-resume", action="store_true",
                    help="resume from a checkpoint written for another config or dataset")
    return ap.parse_args(argv)


def write_result(out: Path, result: dict) -> None:
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out / "result.json")


def summarise(trainer: Trainer, fit: FitResult) -> dict:
    """result.json's content (rank 0), without the weight files."""
    epochs, t = fit.history, trainer.cfg.training
    last = epochs[-1] if epochs else None
    return {
        "status": fit.status, "world_size": trainer.ctx.world_size, "backend": trainer.ctx.backend or "none",
        "strategy": t.strategy, "layout": trainer.strategy.layout(), "restarts": restart_count(),
        "epochs": t.epochs, "epochs_run": trainer.epoch, "steps": trainer.step,
        "resumed_from_step": fit.resumed_from_step,
        "resized_from": fit.resized_from,  # the checkpoint writer's layout and batch, when it was another
        "batch_policy": fit.batch_policy, "stopped_early_at_epoch": fit.stopped_early_at_epoch,
        "kept_epoch": fit.kept_epoch,  # the epoch whose weights are exported (early stopping's best)
        "global_batch": fit.global_batch, "effective_lr": fit.effective_lr,
        "samples_per_s": (sum(h.samples_per_s for h in epochs) / len(epochs)) if epochs else 0.0,
        "train_wall_s": fit.train_wall_s, "checkpoint_stall_s": fit.checkpoint_stall_s,
        "checkpoint_stall_frac": fit.checkpoint_stall_s / max(fit.train_wall_s, 1e-9),
        "goodput": fit.goodput,  # the whole training's, across restarts
        "checkpoint_interval": fit.checkpoint_interval, "perf": fit.last_metrics, "ranks": fit.ranks,
        "final": {"train_loss": last.train_loss, "val_loss": last.val_loss, "val_accuracy": last.val_accuracy}
        if last else {},
        "history": [asdict(h) for h in epochs], "config_id": trainer.config_id, "data_md5": trainer.data_md5,
    }


def train_and_report(cfg: PipelineConfig, splits: Splits, out: Path, data_md5: str,
                     force_resume: bool = False, score_test: Path | None = None) -> dict | None:
    """Join the process group, train ``splits``, and on rank 0 write weights, ``model.pt2`` and
    ``result.json`` into ``out``; returns the result (rank 0) or None. ``score_test`` (the project
    root): rank 0 also scores the exported program on the test split first."""
    t = cfg.training
    out.mkdir(parents=True, exist_ok=True)
    with process_group(t.backend, t.collective_timeout_s) as ctx:
        view = multinode.check_shared_out(ctx, out, cfg)
        sink = MetricsSink.for_rank(ctx.is_main, out, cfg.config_id())  # rank 0: resumes out's MLflow run
        trainer = Trainer(cfg, ctx, splits, out, sink, cfg.config_id(), data_md5, force_resume)
        try:
            fit = trainer.fit()
            # COLLECTIVE: sharded and staged models are gathered to rank 0.
            full = trainer.strategy.full_state_dict(trainer.model) if fit.status == "completed" else None
        finally:
            trainer.release()
        result, model = (summarise(trainer, fit), None) if ctx.is_main else (None, None)
        if full is not None and ctx.is_main:
            # A plain, unwrapped copy: what gets exported, hashed and registered.
            model = trainer.task.build_model(cfg, splits.info)
            model.load_state_dict(full)
            result["weights_sha256"] = state_dict_sha256(model.state_dict())
        result = multinode.share_outcome(ctx, result, out, view)  # COLLECTIVE (several nodes)
    if ctx.is_main and model is not None:
        torch.save(model.state_dict(), out / "weights.pt")
        exported = trainer.task.export_files(cfg, model, splits.info, out)
        if exported is None:
            export_model(trainer.task.export_module(model, splits.info),
                         trainer.task.example_input(cfg, splits.info), out / "model.pt2")
        result.update(weights="weights.pt", model_pt2=exported or "model.pt2")
        if score_test is not None:  # before result.json: the pipeline reads both once that exists
            trainer.task.write_test_scores(cfg, score_test, out)
    if ctx.is_main:
        write_result(out, result)
    elif not view.mine and ctx.local_rank == 0:
        write_result(out, multinode.node_copy(result))
    multinode.carry_on_if_peer_preempted(fit.status, trainer.stop.requested, trainer.step)
    return result if ctx.is_main else None


@record
def main(argv: list[str] | None = None) -> int:
    bind_worker()  # under torchrun: die with the agent, never train on as an orphan
    args = parse_args(argv)
    try:
        return _main(args)
    except TrainflowError as exc:  # bad config or data: the launcher stops the job, no restart
        args.out.mkdir(parents=True, exist_ok=True)
        write_fatal(args.out, int(os.environ.get("RANK", "0")), exc)
        await_stop_after_fatal()
        raise


def _main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    cfg = load_config(args.config, args.overrides)
    root = (args.root or project_root(args.config)).resolve()
    importable_root(root)  # model.factory's module, also under a torchrun typed by hand from elsewhere
    t = cfg.training
    torch.set_num_threads(t.threads_per_worker)
    if t.deterministic:
        # cuBLAS is deterministic only with a fixed workspace, read at its first handle (after this).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    data_md5 = args.data_md5 or read_dvc_file(root, cfg.dataset.dvc_file).md5
    task_for(cfg)  # a config that does not fit its task fails here, before any training
    splits = load_splits(cfg, root, cfg.seed, data_md5)
    score_test = root if os.environ.get(SCORE_ENV) == "1" else None
    train_and_report(cfg, splits, args.out, data_md5, args.force_resume, score_test)
    return 0


if __name__ == "__main__":
    sys.exit(main())
