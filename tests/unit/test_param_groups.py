"""The engine honours the optimizer groups a task declares (``Task.param_groups``): the group's LR
is scaled, and its parameters stay as they are for its frozen epochs, then train."""

from __future__ import annotations

import torch

from core.config import load_config
from tasks import get_task
from tasks.base import ParamGroup
from tests.engine_helpers import ENGINE_CONFIG, ROOT
from training.data import load_splits
from training.distributed import DistContext
from training.sink import MetricsSink
from training.trainer import Trainer, optimizer_groups, plain_name


def test_wrapped_names_match_the_tasks_model():
    assert plain_name("module.2.layer1.0.conv1.weight") == "2.layer1.0.conv1.weight"
    assert plain_name("_orig_mod.module.0.weight") == "0.weight"
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    wrapped = torch.nn.Module()
    wrapped.module = net  # as DDP holds it
    groups, rules = optimizer_groups(wrapped, [ParamGroup("first", frozenset({"0.weight", "0.bias"}), 0.5, 1)])
    assert [len(g["params"]) for g in groups] == [2, 2] and groups[0]["params"][0] is net[0].weight
    assert [(r.lr_scale, r.frozen_epochs) for r in rules] == [(0.5, 1), (1.0, 0)]
    groups, rules = optimizer_groups(net, [ParamGroup("none", frozenset({"9.weight"}))])
    assert len(groups) == 1 and len(rules) == 1  # an empty group is left out


def _fit(tmp_path, monkeypatch, epochs: int) -> tuple[Trainer, dict, dict]:
    cfg = load_config(ENGINE_CONFIG, [f"training.epochs={epochs}", "training.checkpoints=false", "model.kind=mlp",
                                      "training.batch_size=512", "training.warmup_epochs=0",
                                      "training.metrics=false"])
    task_type = type(get_task(cfg.task))

    def first_layer_group(self, cfg, model):
        first = next(m for m in model.modules() if not list(m.children()) and list(m.parameters()))
        names = {n for n, p in model.named_parameters() if any(p is q for q in first.parameters())}
        return (ParamGroup("backbone", frozenset(names), 0.25, 1),)

    monkeypatch.setattr(task_type, "param_groups", first_layer_group)
    splits = load_splits(cfg, ROOT, cfg.seed, "test-data-md5")
    ctx = DistContext(0, 0, 1, None, torch.device("cpu"))
    trainer = Trainer(cfg, ctx, splits, tmp_path / f"out{epochs}", MetricsSink(False), cfg.config_id(), "md5")
    frozen = {id(p) for p in trainer.opt.param_groups[0]["params"]}
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.fit()
    after = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    names = {n for n, p in trainer.model.named_parameters() if id(p) in frozen}
    assert names, "the task's group matched no parameter"
    return trainer, {n: torch.equal(before[n], after[n]) for n in names}, \
        {n: torch.equal(before[n], after[n]) for n in before if n not in names}


def test_a_frozen_group_is_unchanged_in_its_epochs_and_trains_after(tmp_path, monkeypatch):
    trainer, frozen_same, rest_same = _fit(tmp_path, monkeypatch, epochs=1)
    assert all(frozen_same.values()) and not any(rest_same.values())
    lrs = [g["lr"] for g in trainer.opt.param_groups]
    assert len(lrs) == 2 and abs(lrs[0] - 0.25 * lrs[1]) < 1e-12 and lrs[1] > 0
    _, frozen_same, rest_same = _fit(tmp_path, monkeypatch, epochs=2)
    assert not any(frozen_same.values()) and not any(rest_same.values())
