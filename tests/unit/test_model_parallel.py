"""Model parallelism without processes: the LM's layout, the config checks of degrees and kinds."""

from __future__ import annotations

import copy

import pytest
import torch

from core.config import config_from_dict
from core.errors import ConfigError
from tasks import task_for
from tasks.lm_net import split_stage, stage_layers, token_loss
from tasks import get_task
from training.strategies import StrategyConfigError, check_world

LM = {"kind": "lm", "seq_len": 16, "d_model": 32, "n_layers": 4, "n_heads": 4, "d_ff": 64, "dropout": 0.0}


TEXT = {"train_file": "train.jsonl", "eval_file": "val.jsonl", "seq_len": 16}


def lm_cfg(training=None, model=None):
    return config_from_dict({"name": "t", "task": "lm", "dataset": {"path": "d", "text": TEXT},
                             "model": {**LM, **(model or {})},
                             "gates": {"thresholds": {"perplexity": 100.0}},
                             "training": {"strategy": "single", "cpu_workers": 1, **(training or {})}})


# -- the model ---------------------------------------------------------------------------------
def test_lm_is_causal_and_predicts_every_position():
    cfg = lm_cfg()
    torch.manual_seed(0)
    model = get_task(cfg.task).build_model(cfg, {}).eval()
    x = torch.randint(0, 256, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 256  # change the future only
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, 16, 256)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])
    assert token_loss(a, x).ndim == 0  # [n, T, C] logits and [n, T] targets: one mean


def test_token_loss_is_plain_cross_entropy_for_classifiers():
    logits, y = torch.randn(5, 10), torch.randint(0, 10, (5,))
    assert torch.equal(token_loss(logits, y), torch.nn.functional.cross_entropy(logits, y))


def test_stages_compose_to_the_full_model_and_keep_its_parameter_names():
    cfg = lm_cfg()
    torch.manual_seed(0)
    full = get_task(cfg.task).build_model(cfg, {}).eval()
    x = torch.randint(0, 256, (3, 16))
    stages = [split_stage(copy.deepcopy(full), s, 3) for s in range(3)]
    h = x
    with torch.no_grad():
        for stage in stages:
            h = stage(h)
        assert torch.equal(h, full(x))
    keys = [list(s.state_dict()) for s in stages]
    assert sum(len(k) for k in keys) == len(full.state_dict())
    merged = {k: v for s in stages for k, v in s.state_dict().items()}
    fresh = get_task(cfg.task).build_model(cfg, {})
    fresh.load_state_dict(merged)  # strict: the stages together are exactly one plain LM
    assert keys[0][0] == "tok_emb.weight" and keys[-1][-1] == "head.weight"


def test_stage_layers_are_contiguous_and_balanced():
    assert stage_layers(4, 2) == [[0, 1], [2, 3]]
    assert stage_layers(5, 3) == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="cannot split 2 layers into 3"):
        stage_layers(2, 3)


# -- config ------------------------------------------------------------------------------------
def test_degrees_that_do_not_divide_the_world_name_the_keys():
    with pytest.raises(ConfigError, match=r"training\.parallel: tp \(2\) x pp \(1\) must divide the world size 3"):
        lm_cfg({"strategy": "tp", "cpu_workers": 3, "parallel": {"tp": 2}})


@pytest.mark.parametrize("training, match", [
    ({"strategy": "tp", "cpu_workers": 4, "parallel": {"tp": 2}}, "strategy 'tp' needs tp == world size"),
    ({"strategy": "pp", "cpu_workers": 2, "parallel": {"pp": 2, "tp": 2}}, r"must divide the world size 2"),
    ({"strategy": "hybrid", "cpu_workers": 2, "parallel": {"tp": 2}}, "'hybrid' is data x tensor parallel"),
    ({"strategy": "pp", "cpu_workers": 2, "batch_size": 30, "parallel": {"pp": 2}},
     r"training\.parallel: microbatches \(4\) must divide training\.batch_size \(30\)"),
    ({"strategy": "pp", "cpu_workers": 4, "parallel": {"pp": 4, "schedule": "1f1b", "microbatches": 2}},
     "1f1b needs microbatches >= pp"),
])
def test_each_strategy_checks_its_degrees(training, match):
    with pytest.raises(ConfigError, match=match):
        lm_cfg(training)


def test_model_parallel_needs_a_task_plan_and_fitting_shapes():
    table = config_from_dict({"name": "t", "dataset": {"path": "d"},
                              "training": {"strategy": "tp", "cpu_workers": 2, "parallel": {"tp": 2}}})
    with pytest.raises(ConfigError, match=r"training\.strategy: 'tp' \(model parallel\) needs a model that splits "
                                          r"across ranks; task 'classification' .* no tp/pp plan"):
        task_for(table)
    task_for(lm_cfg({"strategy": "tp", "cpu_workers": 2, "parallel": {"tp": 2}}))  # the LM task has one
    with pytest.raises(ConfigError, match=r"training\.parallel\.tp: 8 must divide model\.n_heads \(4\)"):
        task_for(lm_cfg({"strategy": "tp", "cpu_workers": 8, "parallel": {"tp": 8}}))
    with pytest.raises(ConfigError, match=r"training\.parallel\.pp: 8 stages for model\.n_layers 4"):
        task_for(lm_cfg({"strategy": "pp", "cpu_workers": 8, "batch_size": 32, "parallel": {"pp": 8}}))
    with pytest.raises(ConfigError, match=r"model\.d_model: must be divisible by model\.n_heads \(4\), got 30"):
        task_for(lm_cfg(model={"d_model": 30}))


def test_valid_layouts_load():
    assert lm_cfg({"strategy": "tp", "cpu_workers": 2, "parallel": {"tp": 2}}).training.parallel.tp == 2
    assert lm_cfg({"strategy": "pp", "cpu_workers": 4, "parallel": {"pp": 4}}).training.parallel.pp == 4
    cfg = lm_cfg({"strategy": "hybrid", "cpu_workers": 4, "parallel": {"tp": 2}})
    assert cfg.training.strategy == "hybrid"


def test_launch_time_check_uses_the_real_world_size():
    cfg = lm_cfg({"strategy": "tp", "cpu_workers": 2, "parallel": {"tp": 2}})
    check_world("tp", 2, cfg.training.parallel)
    with pytest.raises(StrategyConfigError, match=r"tp \(2\) x pp \(1\) must divide the world size 3"):
        check_world("tp", 3, cfg.training.parallel)  # e.g. --nproc 3 overriding cpu_workers


def _marker(folder, layout):
    import json

    step = folder / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text(json.dumps({"step": 4, "config_id": "c", "data_md5": "d", "layout": layout}))


def test_launcher_refuses_another_layout_before_starting_even_when_forced(tmp_path):
    from training.launcher import _check_resumable
    from training.strategies import layout_for

    cfg = lm_cfg({"strategy": "tp", "cpu_workers": 2, "parallel": {"tp": 2}})
    tp2 = layout_for("tp", 2, cfg.training.parallel)
    _marker(tmp_path, tp2)
    _check_resumable(tmp_path, "c", "d", False, tp2)  # same layout: fine
    pp = lm_cfg({"strategy": "pp", "cpu_workers": 2, "parallel": {"pp": 2}}).training.parallel
    for other in (layout_for("pp", 2, pp), layout_for("ddp", 2)):
        with pytest.raises(ConfigError, match=r"written with strategy 'tp', world size 2, dp 1 x tp 2 x pp 1"):
            _check_resumable(tmp_path, "c", "d", True, other)


def test_data_parallel_checkpoints_still_resume_on_another_world_size(tmp_path):
    from training.launcher import _check_resumable
    from training.strategies import layout_for

    _marker(tmp_path, layout_for("ddp", 2))
    assert _check_resumable(tmp_path, "c", "d", False, layout_for("ddp", 4)) is None  # replicated: no refusal
    # The same checkpoint is still checked for what it was trained on: another config is refused.
    with pytest.raises(ConfigError, match="config"):
        _check_resumable(tmp_path, "other-config", "d", False, layout_for("ddp", 4))


def test_pipeline_eval_of_an_empty_slice_without_a_chunk_size_sums_nothing():
    """A rank whose eval slice is empty, on a strategy built without a batch size (``eval_chunk``
    0), returns zero sums instead of looping with step 0."""
    from types import SimpleNamespace

    from training.parallel import PipelineStrategy

    stub = SimpleNamespace(eval_chunk=0)
    assert PipelineStrategy.eval_sums(stub, None, torch.empty(0, 4), torch.empty(0)) == (0.0, 0.0, 0)
