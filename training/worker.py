"""Worker entry point: one process of a torchrun job (or a plain single process).

    torchrun --nproc-per-node 2 -m training.worker --config configs/digits.yaml --out out/run1

Parses, builds, trains, tears down. Rank 0 writes ``weights.pt``, ``model.pt2``
and ``result.json`` into ``--out``; checkpoints go to ``--out/checkpoints`` and a
rerun with the same ``--out`` resumes from the latest one.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record

from core.config import load_config
from core.manifest import read_dvc_file
from core.paths import project_root
from training.data import load_splits
from training.distributed import process_group
from training.export import export_model
from training.sink import MetricsSink
from training.trainer import Trainer, restart_count, weights_sha256


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="training.worker", description="Train one config (run under torchrun).")
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--root", type=Path, help="project root for dataset paths (default: the config's DVC repo)")
    ap.add_argument("--data-md5", help="data version recorded in checkpoints (default: read from the DVC file)")
    return ap.parse_args(argv)


def write_outputs(trainer: Trainer, fit, out: Path) -> dict:
    """Rank 0: final weights, exported program and result.json."""
    model = trainer.raw_model
    torch.save(model.state_dict(), out / "weights.pt")
    export_model(model, trainer.cfg.dataset.n_features, out / "model.pt2")
    last = fit.history[-1] if fit.history else None
    epochs = fit.history
    result = {
        "status": "completed",
        "world_size": trainer.ctx.world_size,
        "backend": trainer.ctx.backend or "none",
        "restarts": restart_count(),
        "epochs": trainer.cfg.training.epochs,
        "steps": trainer.step,
        "resumed_from_step": fit.resumed_from_step,
        "global_batch": fit.global_batch,
        "effective_lr": fit.effective_lr,
        "samples_per_s": (sum(h.samples_per_s for h in epochs) / len(epochs)) if epochs else 0.0,
        "train_wall_s": fit.train_wall_s,
        "final": {"train_loss": last.train_loss, "val_loss": last.val_loss, "val_accuracy": last.val_accuracy}
        if last else {},
        "history": [h.__dict__ for h in fit.history],
        "weights_sha256": weights_sha256(model),
        "weights": "weights.pt",
        "model_pt2": "model.pt2",
        "config_id": trainer.config_id,
        "data_md5": trainer.data_md5,
    }
    tmp = out / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out / "result.json")
    return result


@record
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    cfg = load_config(args.config, args.overrides)
    root = (args.root or project_root(args.config)).resolve()
    t = cfg.training
    torch.set_num_threads(t.threads_per_worker)
    if t.deterministic:
        torch.use_deterministic_algorithms(True)
    data_md5 = args.data_md5 or read_dvc_file(root, cfg.dataset.dvc_file).md5
    args.out.mkdir(parents=True, exist_ok=True)
    with process_group(t.backend, t.collective_timeout_s) as ctx:
        trainer = Trainer(cfg, ctx, load_splits(cfg.dataset, root, cfg.seed), args.out,
                          MetricsSink.for_rank(ctx.is_main), cfg.config_id(), data_md5)
        try:
            fit = trainer.fit()
        finally:
            trainer.release()
    if ctx.is_main:
        write_outputs(trainer, fit, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
