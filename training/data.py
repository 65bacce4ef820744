"""Loading the dataset splits: in memory by the task, or a table's train split streamed."""

from __future__ import annotations

import logging
from pathlib import Path

from core.config import PipelineConfig
from tasks import get_task
from tasks.splits import Splits


def load_splits(cfg: PipelineConfig, root: Path, seed: int, data_md5: str | None = None) -> Splits:
    """The train / val / test tensors of ``cfg``'s task (a table's ``train`` streamed when
    ``training.loader.kind`` says so); raises DataUnavailableError. ``data_md5`` keys the stream's cache."""
    task = get_task(cfg.task)
    if cfg.training.loader.kind in ("stream", "auto"):
        kind, why = task.loader_kind(cfg, root)
        logging.getLogger("trainflow.train").info("training.loader: %s (%s)", kind, why)
        if kind == "stream":
            from training.stream import stream_splits

            return stream_splits(cfg, root, seed, data_md5 or "")
    splits = task.load_data(cfg, root, seed)
    if hasattr(splits.train, "shard_rows"):  # a task's sharded samples (tasks/image_sharded.py): streamed by shard
        from training.image_stream import ShardStreamSource

        splits.train = ShardStreamSource(splits.train, seed, cfg.training.loader.shuffle_row_groups)
    return splits
