"""Tensor, pipeline and hybrid parallel training of the byte LM under real torchrun (CPU/gloo).

Each strategy trains the same tiny LM (dropout 0, same seed, same global batches) as one
process does; the loss curves and the final weights must agree. Runs go through
``training.worker.train_and_report`` (tests/integration/probes/lm_probe.py), so result.json,
the gathered weights and model.pt2 are the ones a pipeline run would register.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine_helpers import LM_LAYOUTS, lm_runs

pytestmark = pytest.mark.integration

# Measured (3 epochs x 8 steps): per-epoch losses within 5e-7 of one process for tp, pp and
# hybrid (partial sums all-reduced, micro-batch means averaged: only the summation order
# changes); final weights within 1.1e-4 (AdamW divides by sqrt(v): rounding in near-zero
# grads becomes lr-sized steps). Tolerances: ~20x and ~10x those.
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-5
WEIGHT_ATOL = 1e-3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One run per layout, started on first use: {name: (result, out folder)}."""
    layouts = {
        "single": ([], 1),
        "tp": (LM_LAYOUTS["tp"], 2),
        "pp_gpipe": ([*LM_LAYOUTS["pp"], "training.parallel.schedule=gpipe"], 2),
        "pp_1f1b": ([*LM_LAYOUTS["pp"], "training.parallel.schedule=1f1b"], 2),
        # dp2 x tp2: 4 per replica, the same global batch (8) as the others.
        "hybrid": ([*LM_LAYOUTS["hybrid"], "training.batch_size=4"], 4),
    }
    return lm_runs(tmp_path_factory, layouts)


def _curve(result):
    return [(h["train_loss"], h["val_loss"], h["val_accuracy"]) for h in result["history"]]


def _assert_same_training(result, single_result, out, single_out):
    assert result["global_batch"] == single_result["global_batch"] == 8
    assert result["steps"] == single_result["steps"]
    a, b = _curve(result), _curve(single_result)
    assert len(a) == len(b) == 3
    for got, want in zip(a, b):
        for g, w in zip(got, want):
            assert abs(g - w) <= LOSS_ATOL + LOSS_RTOL * abs(w), (a, b)
    assert b[-1][0] < b[0][0] - 0.5  # it learns: the comparison is not between two flat curves
    wa = torch.load(out / "weights.pt", weights_only=True)
    wb = torch.load(single_out / "weights.pt", weights_only=True)
    assert wa.keys() == wb.keys()
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst < WEIGHT_ATOL, worst


@pytest.mark.parametrize("name", ["tp", "pp_gpipe", "pp_1f1b"])
def test_model_parallel_loss_curve_matches_one_process(runs, name):
    result, out = runs(name)
    single, single_out = runs("single")
    assert result["world_size"] == 2 and result["layout"]["strategy"] == name.split("_")[0]
    _assert_same_training(result, single, out, single_out)


def test_hybrid_dp2_x_tp2_matches_one_process(runs):
    result, out = runs("hybrid")
    single, single_out = runs("single")
    assert result["layout"] == {"strategy": "hybrid", "world_size": 4, "dp": 2, "tp": 2, "pp": 1}
    assert [(r["dp_rank"], r["tp_rank"]) for r in result["ranks"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    _assert_same_training(result, single, out, single_out)


def test_memory_per_rank_is_reported_and_split(runs):
    single = runs("single")[0]["ranks"][0]
    tp = runs("tp")[0]["ranks"]
    pp = runs("pp_gpipe")[0]["ranks"]
    for r in (*tp, *pp):
        assert r["peak_mem_mb"] > 0
    # Pipeline stages hold disjoint parameters: together exactly one model, each a part of it.
    assert sum(r["param_bytes"] for r in pp) == single["param_bytes"]
    assert all(0 < r["param_bytes"] < single["param_bytes"] for r in pp)
    assert [r["pp_stage"] for r in pp] == [0, 1] and [r["stage_layers"] for r in pp] == [[0], [1]]
    # Tensor parallel: block Linears are halved, embeddings / norms / head replicated.
    for r in tp:
        assert single["param_bytes"] / 2 < r["param_bytes"] < single["param_bytes"]
        assert single["optim_bytes"] / 2 < r["optim_bytes"] < single["optim_bytes"]


@pytest.mark.parametrize("name", ["tp", "pp_1f1b"])
def test_gathered_weights_load_into_a_plain_lm_and_the_export_matches(runs, name):
    from core.config import config_from_dict
    from tests.integration.probes.lm_probe import BASE, lm_splits
    from training.export import load_exported
    from tasks import get_task
    from training.trainer import state_dict_sha256

    result, out = runs(name)
    cfg = config_from_dict(BASE)
    model = get_task(cfg.task).build_model(cfg, {})
    model.load_state_dict(torch.load(out / "weights.pt", weights_only=True))  # strict: every key, no extra
    assert state_dict_sha256(model.state_dict()) == result["weights_sha256"]
    x = lm_splits(cfg.model.seq_len, 64, 16, 8).test.tensors[0][:3]
    exported = load_exported(out / "model.pt2")
    with torch.no_grad():
        want = model.eval()(x)
        assert torch.allclose(exported(x), want, atol=1e-5)
        assert torch.allclose(exported(x[:, :7]), model(x[:, :7]), atol=1e-5)  # shorter context
