"""The engine's validation pass runs ``training.batch_size`` rows a forward, not the whole split in
one (a language model's logits over a real validation split would not fit), with the same loss."""

from __future__ import annotations

import pytest
import torch

from core.config import load_config
from tests.engine_helpers import ENGINE_CONFIG, ROOT
from training.data import load_splits
from training.distributed import DistContext
from training.sink import MetricsSink
from training.trainer import Trainer


def test_validation_runs_a_training_batch_a_forward_and_scores_the_whole_split(tmp_path):
    cfg = load_config(ENGINE_CONFIG, ["training.checkpoints=false", "training.metrics=false", "model.kind=mlp",
                                      "training.batch_size=16"])
    splits = load_splits(cfg, ROOT, cfg.seed, "test-data-md5")
    trainer = Trainer(cfg, DistContext(0, 0, 1, None, torch.device("cpu")), splits, tmp_path / "out",
                      MetricsSink(False), cfg.config_id(), "md5")
    rows: list[int] = []
    trainer.model.register_forward_pre_hook(lambda module, args: rows.append(len(args[0])))
    val_loss, val_acc, _ = trainer._evaluate()
    x, y = splits.val.tensors
    assert len(x) > 16 and max(rows) == 16 and sum(rows) == len(x)  # the whole split, 16 rows at a time
    trainer.model.eval()
    with torch.no_grad():
        whole = trainer.model(x)
    assert val_loss == pytest.approx(trainer.task.loss(whole, y, reduction="sum").item() / y.numel(), rel=1e-6)
    assert val_acc == pytest.approx(trainer.task.val_accuracy(trainer.task.val_correct(whole, y), y.numel()))
