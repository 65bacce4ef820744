"""The best epoch, not the last: the early-stopping rule in each metric's direction, the task's
validation scores, and the best weights carried by a checkpoint."""

import math

import numpy as np
import pytest
import torch

from core.config import load_config
from core.errors import ConfigError
from tasks import get_task
from tasks.metrics import probability_scores, softmax
from training.checkpoint import CheckpointManager, TrainState, model_copy, restore_model
from training.distributed import DistContext
from training.parallel import build_strategy
from training.trainer import EpochStats, followed_value, improved, lower_is_better

CTX = DistContext(0, 0, 1, None, torch.device("cpu"))


def _stats(epoch, val_loss, acc=None, **scores):
    return EpochStats(epoch, 0.0, val_loss, acc, 1.0, 1.0, 0.1, scores)


def _best_epoch(history, metric, min_delta=0.0):
    best = best_epoch = None
    for s in history:
        value = followed_value(s, metric)
        if improved(value, best, min_delta, metric):
            best, best_epoch = lower_is_better(value, metric), s.epoch
    return best_epoch


def test_the_best_epoch_is_found_in_each_metrics_direction():
    # Overfitting: the loss falls, then rises; log loss likewise; AUC peaks in the middle.
    history = [_stats(1, 0.9, log_loss=0.9, roc_auc=0.70), _stats(2, 0.4, log_loss=0.5, roc_auc=0.81),
               _stats(3, 0.5, log_loss=0.45, roc_auc=0.80), _stats(4, 0.8, log_loss=0.7, roc_auc=0.75)]
    assert _best_epoch(history, "val_loss") == 2
    assert _best_epoch(history, "val_log_loss") == 3  # lower is better
    assert _best_epoch(history, "val_roc_auc") == 2  # higher is better
    assert _best_epoch(history, "val_roc_auc", min_delta=0.2) == 1  # no later epoch beats it by 0.2


def test_a_nan_score_never_counts_as_an_improvement():
    assert not improved(math.nan, None, 0.0, "val_roc_auc")
    assert improved(0.6, None, 0.0, "val_roc_auc")


def test_probability_scores_match_scikit_learn():
    from sklearn import metrics as skm

    rng = np.random.default_rng(0)
    for k in (2, 3):
        y = rng.integers(0, k, 400)
        logits = rng.normal(size=(400, k)) + 1.5 * np.eye(k)[y]
        logits[:50] = np.round(logits[:50])  # ties
        p = softmax(logits)
        got = probability_scores(y, p)
        onehot = np.eye(k)[y]
        auc = skm.roc_auc_score(y, p[:, 1]) if k == 2 else skm.roc_auc_score(y, p, multi_class="ovr")
        rare = 0 if (y == 1).sum() > (y == 0).sum() else 1  # a binary task's average precision: its rarer class's
        ap = (skm.average_precision_score(y == rare, p[:, rare]) if k == 2
              else skm.average_precision_score(onehot, p))
        assert got["roc_auc"] == pytest.approx(auc, abs=1e-12)
        assert got["average_precision"] == pytest.approx(ap, abs=1e-12)
        assert got["log_loss"] == pytest.approx(skm.log_loss(y, p), abs=1e-9)
        assert got["balanced_accuracy"] == pytest.approx(skm.balanced_accuracy_score(y, p.argmax(1)))
        assert got["macro_f1"] == pytest.approx(skm.f1_score(y, p.argmax(1), average="macro"))


def test_early_stopping_follows_a_score_only_where_the_task_reports_it(repo_root):
    cfg = load_config(repo_root / "configs" / "digits.yaml", ["training.early_stopping.metric=val_roc_auc"])
    get_task(cfg.task).check_config(cfg)  # a classifier reports it
    lm = load_config(repo_root / "configs" / "stdlib-lm.yaml", ["training.early_stopping.metric=val_roc_auc"])
    with pytest.raises(ConfigError, match=r"training\.early_stopping\.metric: .* reports no val_roc_auc"):
        get_task(lm.task).check_config(lm)


def test_restore_best_keeps_the_config_id(repo_root):
    plain = load_config(repo_root / "configs" / "digits.yaml")
    same = load_config(repo_root / "configs" / "digits.yaml", ["training.early_stopping.restore_best=true"])
    other = load_config(repo_root / "configs" / "digits.yaml", ["training.early_stopping.restore_best=false"])
    assert plain.config_id() == same.config_id() != other.config_id()


def test_a_checkpoint_carries_the_best_weights_and_epoch(tmp_path):
    strategy = build_strategy("single", CTX)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    best = model_copy(strategy, model)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()  # the live weights move on past the best epoch's
    st = TrainState(model=model, optimizer=opt, step=5, epoch=2, best=0.3, best_epoch=1, best_model=best)
    ck = CheckpointManager(tmp_path, CTX, strategy)
    ck.maybe_save(5, st, force=True)
    ck.wait()
    fresh = torch.nn.Linear(4, 2)
    loaded = ck.load_state(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1))
    assert loaded.best_epoch == 1 and loaded.best == 0.3
    assert torch.equal(fresh.weight, model.weight)  # the model resumes where it was
    restore_model(strategy, fresh, loaded.best_model)  # and ends with the best epoch's weights
    assert all(torch.equal(fresh.state_dict()[k], best[k]) for k in best)
    assert not torch.equal(fresh.weight, model.weight)


def test_a_checkpoint_without_best_weights_resumes_with_none(tmp_path):
    strategy = build_strategy("single", CTX)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    ck = CheckpointManager(tmp_path, CTX, strategy)
    meta = TrainState(model=model, optimizer=opt, step=1).meta()
    del meta["best_epoch"]  # a checkpoint written before the key existed
    ck.save(1, model, opt, meta)
    ck.wait()
    fresh = torch.nn.Linear(4, 2)
    loaded = ck.load_state(fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1))
    assert loaded.best_epoch is None and loaded.best_model is None
