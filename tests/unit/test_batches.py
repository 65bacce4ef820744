"""The global sample cursor: plans, sources and the batch policy (training/batches.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils.data import TensorDataset

from core.config import LoaderConfig
from training.batches import BatchPlan, DataLoaderSource, InMemorySource, choose_plan, global_order, scaled_lr


def _data(n: int) -> TensorDataset:
    ids = torch.arange(n)
    return TensorDataset(ids.float().unsqueeze(1) * 10, ids)  # y == the sample id: rows are traceable


def _run(source, epoch: int, cursor: int, micro: int, accum: int, dp: int, stop_after: int | None = None):
    """Every rank's steps from ``cursor`` (each rank runs its own generator, as real ranks do).
    Returns (ids consumed per step over all ranks, the new cursor, per-rank step counts)."""
    plans = [BatchPlan.of(micro, accum, dp, r) for r in range(dp)]
    gens = [source.epoch_steps(epoch, cursor, p) for p in plans]
    consumed, counts = [], [0] * dp
    while stop_after is None or len(consumed) < stop_after:
        steps = [next(g, None) for g in gens]
        if all(s is None for s in steps):
            break
        assert all(s is not None for s in steps), "ranks disagree on the number of steps"
        totals = {s.global_samples for s in steps}
        assert len(totals) == 1
        step_ids = []
        for r, s in enumerate(steps):
            counts[r] += 1
            assert len(s.micro) == len(s.ids) == accum  # exactly `a` micro-batches, empty or not
            for (x, y), ids in zip(s.micro, s.ids):
                assert torch.equal(y, ids) and torch.equal(x[:, 0], ids.float() * 10)
                assert len(ids) <= micro
                step_ids += ids.tolist()
        assert len(step_ids) == totals.pop()
        consumed.append(step_ids)
        cursor += len(step_ids)
    return consumed, cursor, counts


def test_plan_checks_its_invariant():
    assert BatchPlan.of(32, 2, 2, 1).global_batch == 128
    with pytest.raises(ValueError, match="global_batch 100 != micro_batch 32"):
        BatchPlan(100, 32, 1, 2, 0)
    with pytest.raises(ValueError, match="dp_rank"):
        BatchPlan.of(4, 1, 2, 2)
    assert BatchPlan.of(8, 1, 2).steps(33) == 3 and BatchPlan.of(8, 1, 2).steps(33, cursor=32) == 1


def test_global_order_depends_on_seed_and_epoch_only():
    a, b = global_order(50, 3, 1), global_order(50, 3, 1)
    assert torch.equal(a, b) and sorted(a.tolist()) == list(range(50))
    assert not torch.equal(a, global_order(50, 3, 2)) and not torch.equal(a, global_order(50, 4, 1))


def test_each_sample_once_per_epoch_across_a_2_1_2_resize_with_different_plans():
    n = 103  # no plan below divides it: every epoch ends in a short step
    src = InMemorySource(_data(n), seed=7)
    for epoch in range(2):
        first, c1, _ = _run(src, epoch, 0, micro=4, accum=1, dp=2, stop_after=5)  # G 8, 2 ranks
        second, c2, _ = _run(src, epoch, c1, micro=4, accum=2, dp=1, stop_after=4)  # G 8 kept, 1 rank
        third, c3, counts = _run(src, epoch, c2, micro=3, accum=2, dp=2)  # another plan: G 12
        assert (c1, c2, c3) == (40, 72, n) and len(set(counts)) == 1
        seen = Counter(i for step in first + second + third for i in step)
        assert set(seen) == set(range(n)) and set(seen.values()) == {1}
        # The consumed prefix is the epoch's global order, whatever the layouts were.
        order = global_order(n, 7, epoch).tolist()
        flat = [i for step in first + second + third for i in sorted(step, key=order.index)]
        assert flat == order


def test_short_last_step_gives_empty_micro_batches_on_some_ranks():
    src = InMemorySource(_data(21), seed=0)
    steps, cursor, counts = _run(src, 0, 0, micro=4, accum=2, dp=2)  # G 16: steps of 16 and 5
    assert [len(s) for s in steps] == [16, 5] and cursor == 21 and counts == [2, 2]
    last = [list(src.epoch_steps(0, 16, BatchPlan.of(4, 2, 2, r)))[0] for r in range(2)]
    # Micro-step 0: rank 0 takes 4, rank 1 takes 1; micro-step 1 is empty on both.
    assert [[len(i) for i in s.ids] for s in last] == [[4, 0], [1, 0]]
    assert all(s.micro[1][0].shape == (0, 1) for s in last)


def test_cursor_at_the_end_of_the_epoch_yields_no_step_and_past_it_is_an_error():
    src = InMemorySource(_data(10), seed=0)
    assert list(src.epoch_steps(0, 10, BatchPlan.of(4, 1, 1))) == []
    with pytest.raises(ValueError, match="outside"):
        list(src.epoch_steps(0, 11, BatchPlan.of(4, 1, 1)))


def test_dataloader_source_yields_the_same_micro_batches():
    data = _data(23)
    plan = BatchPlan.of(3, 2, 2, 1)
    mem = list(InMemorySource(data, 5).epoch_steps(1, 6, plan))
    dl = list(DataLoaderSource(data, 5, LoaderConfig(kind="dataloader")).epoch_steps(1, 6, plan))
    assert len(mem) == len(dl)
    for a, b in zip(mem, dl):
        assert a.global_samples == b.global_samples
        for (xa, ya), (xb, yb) in zip(a.micro, b.micro):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


# -- the batch policy ------------------------------------------------------------------------
LR, BASE = 0.002, 32


def _writer(dp, micro, accum, configured=None, lr=None):
    g = dp * micro * accum
    return {"dp_size": dp, "micro_batch": micro, "grad_accum": accum, "global_batch": g,
            "lr": lr if lr is not None else scaled_lr(LR, g, BASE, "sqrt"), "configured": configured or [micro, accum]}


def test_policy_fresh_and_same_layout():
    fresh = choose_plan(32, 1, 2, LR, BASE, "sqrt", None)
    assert (fresh.decision, fresh.global_batch, fresh.lr) == ("fresh", 64, scaled_lr(LR, 64, BASE, "sqrt"))
    same = choose_plan(32, 1, 2, LR, BASE, "sqrt", _writer(2, 32, 1))
    assert same.decision == "unchanged" and same.changed == []


def test_policy_2_to_1_keeps_the_global_batch_with_more_micro_steps():
    c = choose_plan(32, 1, 1, LR, BASE, "sqrt", _writer(2, 32, 1))
    assert (c.micro_batch, c.grad_accum, c.global_batch) == (32, 2, 64)
    assert c.decision == "kept_global_batch" and c.lr == scaled_lr(LR, 64, BASE, "sqrt")
    assert c.changed == ["dp_size", "grad_accum"] and "kept global batch 64" in c.reason


def test_policy_1_to_2_keeps_the_global_batch_with_a_smaller_per_rank_batch():
    c = choose_plan(32, 1, 2, LR, BASE, "sqrt", _writer(1, 32, 1))
    assert (c.micro_batch, c.grad_accum, c.global_batch) == (16, 1, 32)
    assert c.record()["changed"] == ["dp_size", "micro_batch"]


def test_policy_never_grows_the_per_rank_batch_to_keep_the_global_batch():
    c = choose_plan(10, 1, 2, LR, BASE, "sqrt", _writer(3, 10, 1))  # G 30 over 2 ranks: 15 each is too big
    assert (c.micro_batch, c.grad_accum, c.global_batch) == (5, 3, 30)


def test_policy_rescales_the_lr_when_the_global_batch_cannot_be_kept():
    c = choose_plan(32, 1, 3, LR, BASE, "linear", _writer(2, 32, 1, lr=scaled_lr(LR, 64, BASE, "linear")))
    assert c.decision == "rescaled_lr" and (c.micro_batch, c.grad_accum, c.global_batch) == (32, 1, 96)
    assert c.lr == pytest.approx(LR * 3) and "lr" in c.changed and "'linear' rule" in c.reason


def test_policy_follows_a_changed_config_batch():
    c = choose_plan(16, 1, 2, LR, BASE, "sqrt", _writer(2, 32, 1))
    assert c.decision == "configured" and c.global_batch == 32 and c.lr == scaled_lr(LR, 32, BASE, "sqrt")


def test_policy_continues_a_resized_writers_plan_on_the_same_dp_size():
    # Written by a 1-rank run that itself kept G 64 as 32 x 2 micro-steps (configured 32 x 1).
    c = choose_plan(32, 1, 1, LR, BASE, "sqrt", _writer(1, 32, 2, configured=[32, 1]))
    assert c.decision == "unchanged" and (c.micro_batch, c.grad_accum) == (32, 2)


def test_uneven_and_empty_micro_batches_give_the_full_batch_mean_gradient():
    # A short last step over micro-batches of 4, 1 and 0 rows: the scaled sums are the step's mean.
    from tasks import get_task
    from training.distributed import DistContext
    from training.parallel import build_strategy

    strat = build_strategy("single", DistContext(0, 0, 1, None, torch.device("cpu")))
    strat.task = get_task("classification")
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 4)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 2, 3, 1])
    total = 0.0
    for lo, hi in ((0, 4), (4, 5), (5, 5)):
        total += strat.forward_backward(model, x[lo:hi], y[lo:hi], scale=1 / 5)
    split = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    full = torch.nn.functional.cross_entropy(model(x), y)
    full.backward()
    assert total == pytest.approx(full.item() * 5, rel=1e-6)
    for a, b in zip(split, (p.grad for p in model.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
