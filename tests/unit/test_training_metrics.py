"""training.metrics in one process: the aggregation rule on fixed inputs, the window
bookkeeping on a fake clock, byte and FLOP counts on small models."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import training.metrics as tm
from training.distributed import DistContext
from training.metrics import (
    StepMetrics,
    aggregate,
    find_straggler,
    flops_per_sample,
    gpu_utilization,
    mfu,
    peak_memory_bytes,
    state_bytes,
    tensor_bytes,
)

CPU = torch.device("cpu")
SOLO = DistContext(0, 0, 1, None, CPU)


def rank_stats(rank, median_s, *, window_s=10.0, steps=100, samples=3200, data_wait_s=1.0,
               allreduce_s=2.0, ckpt_stall_s=0.0, peak=100 << 20):
    return {"rank": rank, "window_s": window_s, "steps": steps, "samples": samples,
            "step_time_median_s": median_s, "data_wait_s": data_wait_s, "allreduce_s": allreduce_s,
            "ckpt_stall_s": ckpt_stall_s, "peak_mem_bytes": peak}


# -- aggregate ---------------------------------------------------------------------------
def test_aggregate_without_straggler():
    per_rank = [
        rank_stats(1, 0.110, window_s=10.0, data_wait_s=3.0, allreduce_s=1.0, ckpt_stall_s=0.5, peak=200 << 20),
        rank_stats(0, 0.100, window_s=8.0, data_wait_s=1.0, allreduce_s=3.0, ckpt_stall_s=1.0, peak=100 << 20),
    ]
    s = aggregate(per_rank, straggler_ratio=1.5)
    assert s["window_s"] == 10.0
    assert s["samples_per_s"] == pytest.approx(6400 / 10.0)
    assert s["step_time_min_ms"] == pytest.approx(100.0)
    assert s["step_time_median_ms"] == pytest.approx(105.0)
    assert s["step_time_max_ms"] == pytest.approx(110.0)
    assert s["straggler"] is False and s["straggler_rank"] is None
    assert s["data_wait_frac"] == pytest.approx(0.3)  # rank 1: 3 s of its 10 s
    assert s["allreduce_s"] == pytest.approx(2.0)  # mean over ranks
    assert s["allreduce_frac"] == pytest.approx(0.2)
    assert s["ckpt_stall_s"] == 1.0 and s["ckpt_stall_frac"] == pytest.approx(0.1)
    assert s["peak_mem_mb"] == [100.0, 200.0]  # rank order, whatever order they came in
    assert s["steps"] == 100


def test_aggregate_flags_the_slow_rank():
    medians = [0.100, 0.102, 0.240, 0.098]  # each with 10 ms data wait + 20 ms all-reduce a step
    s = aggregate([rank_stats(r, m) for r, m in enumerate(medians)], straggler_ratio=1.5)
    # compute per step 70, 72, 210, 68 ms: rank 2 is 3x the others' median (70 ms)
    assert s["straggler"] is True and s["straggler_rank"] == 2
    assert s["straggler_ratio"] == pytest.approx(3.0) and s["straggler_lag_ms"] == pytest.approx(140.0)
    assert s["step_time_max_ms"] == pytest.approx(240.0)
    assert s["step_time_median_ms"] == pytest.approx(101.0)
    # A looser threshold lets the same inputs pass.
    s = aggregate([rank_stats(r, m) for r, m in enumerate(medians)], straggler_ratio=3.5)
    assert s["straggler"] is False and s["straggler_rank"] is None and s["straggler_ratio"] == pytest.approx(3.0)


def test_under_ddp_equal_step_times_still_name_the_slow_rank_by_its_peers_allreduce_wait():
    # What DDP does to a slow rank 1: both ranks' steps take 100 ms (the all-reduce syncs them);
    # fast rank 0 spends 60 of them waiting in the all-reduce for rank 1's gradients.
    fast = rank_stats(0, 0.100, data_wait_s=0.5, allreduce_s=6.0)   # compute 100-5-60 = 35 ms
    slow = rank_stats(1, 0.100, data_wait_s=0.5, allreduce_s=0.5)   # compute 100-5-5 = 90 ms
    s = aggregate([fast, slow], straggler_ratio=1.5)
    assert s["step_time_min_ms"] == s["step_time_max_ms"]  # the step times cannot tell them apart
    assert s["straggler"] is True and s["straggler_rank"] == 1
    assert s["straggler_ratio"] == pytest.approx(90 / 35) and s["straggler_lag_ms"] == pytest.approx(55.0)
    assert s["per_rank"]["rank/0/allreduce_wait_ms"] == pytest.approx(60.0)
    assert s["per_rank"]["rank/1/compute_ms"] == pytest.approx(90.0)


def test_straggler_rule_is_strict_uses_the_other_ranks_median_and_ignores_tiny_lags():
    # 2 ranks: the other's median is the other rank, so 2x slower is 2x (the mean would say 1.33x).
    two = [rank_stats(0, 0.1, data_wait_s=0.0, allreduce_s=0.0), rank_stats(1, 0.2, data_wait_s=0.0, allreduce_s=0.0)]
    assert aggregate(two, 1.9)["straggler_rank"] == 1
    assert aggregate(two, 2.0)["straggler"] is False  # exactly the ratio: not above it
    # 3x slower but only 0.4 ms a step: scheduler noise on tiny steps, not a straggler.
    tiny = [rank_stats(0, 0.0002, data_wait_s=0.0, allreduce_s=0.0),
            rank_stats(1, 0.0006, data_wait_s=0.0, allreduce_s=0.0)]
    s = aggregate(tiny, 1.5)
    assert s["straggler"] is False and s["straggler_ratio"] == pytest.approx(3.0)
    assert s["straggler_lag_ms"] == pytest.approx(0.4)
    # The others' waits took their whole step: any real compute is infinitely more.
    s = aggregate([rank_stats(0, 0.1, data_wait_s=0.0, allreduce_s=10.0), rank_stats(1, 0.1, allreduce_s=0.0)], 1.5)
    assert s["straggler_rank"] == 1 and s["straggler_ratio"] is None and s["straggler_lag_ms"] == pytest.approx(90.0)
    # One rank has nobody to be slower than.
    assert aggregate([rank_stats(0, 0.5)], 1.5)["straggler_ratio"] is None


def test_compute_is_the_median_step_less_every_wait_per_step_and_never_negative():
    r = {**rank_stats(0, 0.1, steps=4, data_wait_s=0.04, allreduce_s=0.08), "forward_sync_s": 0.12}
    assert tm.compute_per_step_s(r) == pytest.approx(0.04)  # 0.1 - (0.04 + 0.08 + 0.12) / 4
    r = rank_stats(0, 0.1, steps=4, data_wait_s=1.0, allreduce_s=1.0)
    assert tm.compute_per_step_s(r) == 0.0
    assert tm.compute_per_step_s(rank_stats(0, None, steps=0)) is None


def test_per_rank_and_per_node_metrics_are_named_as_logged():
    ranks = [rank_stats(1, 0.110, peak=200 << 20), rank_stats(0, None, steps=0, samples=0, peak=100 << 20)]
    ranks[1]["node"] = {"node": 0, "cpu_util_pct": 55.0, "mem_used_mb": 1024.0, "gpu_util_pct": None}
    s = aggregate(ranks, 1.5)
    assert s["per_rank"] == pytest.approx({
        "rank/0/peak_mem_mb": 100.0,  # no step in the window: only its memory
        "rank/1/step_time_ms": 110.0, "rank/1/data_wait_ms": 10.0, "rank/1/allreduce_wait_ms": 20.0,
        "rank/1/forward_sync_ms": 0.0, "rank/1/compute_ms": 80.0, "rank/1/peak_mem_mb": 200.0,
        "node/0/cpu_util_pct": 55.0, "node/0/mem_used_mb": 1024.0,  # a number not read is left out
    })


def test_node_stats_on_cpu_name_the_node_from_torchrun(monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "3")
    n = tm.node_stats(CPU)
    assert n["node"] == 3 and n["mem_used_mb"] > 0 and 0 <= n["cpu_util_pct"] <= 100
    assert "gpu_util_pct" not in n


def test_aggregate_with_ranks_that_ran_no_step():
    s = aggregate([rank_stats(0, None, steps=0, samples=0), rank_stats(1, None, steps=0, samples=0)], 1.5)
    assert s["step_time_median_ms"] is None and s["straggler"] is False and s["samples_per_s"] == 0.0
    s = aggregate([rank_stats(0, 0.2), rank_stats(1, None, steps=0)], 1.5)
    assert s["step_time_min_ms"] == s["step_time_max_ms"] == pytest.approx(200.0)
    s = aggregate([rank_stats(0, None, window_s=0.0, steps=0, samples=0, data_wait_s=0.0, allreduce_s=0.0)], 1.5)
    assert s["samples_per_s"] == s["allreduce_frac"] == s["data_wait_frac"] == 0.0


# -- StepMetrics on a fake clock -------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def tick(self, dt):
        self.t += dt


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(tm, "_now", c)
    return c


def test_window_bookkeeping_single_process(clock):
    m = StepMetrics(SOLO)
    for wait, compute in [(0.01, 0.09), (0.03, 0.07), (0.02, 0.18)]:
        m.data_start()
        clock.tick(wait)
        m.data_end()
        clock.tick(compute)
        m.step_end(32)
    m.add_checkpoint_stall(0.2)
    clock.tick(0.5)
    s = m.snapshot()
    assert s["steps"] == 3 and s["window_s"] == pytest.approx(0.9)
    assert s["samples_per_s"] == pytest.approx(96 / 0.9)
    # steps took 0.1, 0.1, 0.2 s: one rank, so min = median = max = its median
    assert s["step_time_min_ms"] == s["step_time_median_ms"] == s["step_time_max_ms"] == pytest.approx(100.0)
    assert s["data_wait_frac"] == pytest.approx(0.06 / 0.9)
    assert s["ckpt_stall_s"] == pytest.approx(0.2) and s["ckpt_stall_frac"] == pytest.approx(0.2 / 0.9)
    assert s["allreduce_s"] == 0.0 and s["straggler"] is False
    assert len(s["peak_mem_mb"]) == 1 and s["peak_mem_mb"][0] > 0

    # The window was reset: the next one starts at the snapshot.
    clock.tick(0.25)
    m.step_end(8)
    s = m.snapshot()
    assert s["steps"] == 1 and s["window_s"] == pytest.approx(0.25)
    assert s["step_time_median_ms"] == pytest.approx(250.0) and s["ckpt_stall_s"] == 0.0


def test_tokens_a_second_sum_each_steps_tokens_and_only_where_the_task_counts_them(clock):
    m = StepMetrics(SOLO)
    clock.tick(0.1)
    m.step_end(8, torch.tensor(100))  # a tensor, summed where it is until the window reads it
    clock.tick(0.1)
    m.step_end(8, 60)
    s = m.snapshot()
    assert s["tokens_per_s"] == pytest.approx(160 / 0.2) and s["samples_per_s"] == pytest.approx(16 / 0.2)
    clock.tick(0.1)
    m.step_end(8)
    assert "tokens_per_s" not in m.snapshot()  # the next window counted none
    both = aggregate([{**m._local_stats(), "rank": 0, "tokens": 30.0, "window_s": 0.5},
                      {**m._local_stats(), "rank": 1, "tokens": 20.0, "window_s": 0.5}])
    assert both["tokens_per_s"] == pytest.approx(100.0)  # every rank's tokens over the window


class DDPStats:
    """DDP's runtime stats as ``_get_ddp_logging_data`` gives them after each step: the previous
    iteration's all-reduce (the first read: the previous window's last step), ``seconds`` in turn."""

    def __init__(self, seconds=None):
        self.iteration, self.seconds = 0, seconds

    def _get_ddp_logging_data(self):
        self.iteration += 1
        s = self.seconds[self.iteration - 1] if self.seconds else 0.004
        return {"iteration": self.iteration, "backward_comm_time": round(s * 1e9)}


def test_each_steps_all_reduce_is_read_one_step_late_and_the_unread_last_step_left_out(clock):
    m = StepMetrics(SOLO)
    m._ddp = DDPStats([0.5, 0.1, 0.2])  # the previous window's last step, then steps 1 and 2
    for comm in (0.1, 0.2, 0.3):
        clock.tick(0.01 + comm)
        m.step_end(8)
    s = m._local_stats()
    assert s["compute_median_s"] == pytest.approx(0.01)  # steps 1 and 2 less their own all-reduce
    assert s["allreduce_s"] == pytest.approx(0.8) and s["steps"] == 3


def test_each_step_loses_its_own_waits_so_one_long_wait_cannot_hide_a_slow_rank(clock):
    # What CI saw at an epoch's end: rank 0 writes the checkpoint while slow rank 1 (60 ms of
    # compute a step, rank 0 has 20) waits 300 ms for it in one step's DDP buffer broadcast.
    def window(compute_s, waits_s):
        m = StepMetrics(SOLO)
        m._ddp = DDPStats()
        for compute, wait in zip(compute_s, waits_s):
            m._fwd_sync += wait  # as the forward-sync hook adds it
            clock.tick(compute + wait + 0.004)  # the gradient all-reduce 4 ms
            m.step_end(32)
        return m._local_stats()

    fast = {**window([0.02] * 5, [0.04] * 5), "rank": 0}  # waits 40 ms a step for rank 1
    slow = {**window([0.06] * 5, [0.3, 0, 0, 0, 0]), "rank": 1}
    assert tm.compute_per_step_s(fast) == pytest.approx(0.02)
    assert tm.compute_per_step_s(slow) == pytest.approx(0.06)
    assert find_straggler([fast, slow], 1.5)["straggler_rank"] == 1
    # The window's mean wait per step, taken from its median step, would have hidden it.
    assert tm.compute_per_step_s({**slow, "compute_median_s": None}) == pytest.approx(0.0)


def test_data_end_without_start_is_ignored_and_a_wait_spanning_a_reset_is_clipped(clock):
    m = StepMetrics(SOLO)
    m.data_end()
    m.data_start()
    clock.tick(1.0)
    m.reset()
    clock.tick(0.5)
    m.data_end()
    clock.tick(0.5)
    assert m._local_stats()["data_wait_s"] == pytest.approx(0.5)


def test_straggler_warning_is_logged_on_rank_0(monkeypatch, caplog, clock):
    import torch.distributed as dist

    peers = [rank_stats(1, 0.100), rank_stats(2, 0.500)]

    def fake_gather(out, obj):  # stands in for the collective: this rank plus two fixed peers
        out[:] = [obj, *peers]

    monkeypatch.setattr(dist, "all_gather_object", fake_gather)
    m = StepMetrics(DistContext(0, 0, 3, "gloo", CPU), straggler_ratio=1.5)
    for _ in range(3):
        clock.tick(0.1)
        m.step_end(4)
    with caplog.at_level(logging.WARNING, logger="trainflow.train"):
        s = m.snapshot()
    assert s["straggler"] is True and s["straggler_rank"] == 2
    assert {"rank/0/compute_ms", "rank/1/compute_ms", "rank/2/compute_ms"} <= set(s["per_rank"])
    assert any("straggler: rank 2 computes 470.0 ms" in r.getMessage() for r in caplog.records)
    # Any other rank gets None (and logs nothing).
    caplog.clear()
    other = StepMetrics(DistContext(1, 1, 3, "gloo", CPU))
    peers[:] = [rank_stats(0, 0.1), rank_stats(2, 0.5)]
    assert other.snapshot() is None and not caplog.records


def test_attach_is_a_no_op_without_a_process_group(clock):
    m = StepMetrics(SOLO)
    model = nn.Linear(2, 2)
    m.attach(model)  # not DDP, not distributed: nothing to time, no error
    assert not model._forward_pre_hooks and not model._forward_hooks and not model._backward_hooks
    model.train()
    clock.tick(0.1)
    model(torch.ones(3, 2)).sum().backward()
    m.step_end(3)
    s = m.snapshot()
    assert s["steps"] == 1 and s["allreduce_s"] == 0.0
    assert s["per_rank"]["rank/0/forward_sync_ms"] == 0.0 and s["per_rank"]["rank/0/allreduce_wait_ms"] == 0.0


def test_per_step_bookkeeping_is_three_clock_reads_and_no_collective(monkeypatch):
    """What runs on every training step stays small whatever the machine: one clock read in each of
    data_start, data_end and step_end, appends to the window's lists, and no collective (only
    ``snapshot``, once a window, talks to the other ranks)."""
    reads = []
    monkeypatch.setattr(tm, "_now", lambda: reads.append(None) or float(len(reads)))

    def no_collective(*args):
        raise AssertionError("a collective on the per-step path")

    monkeypatch.setattr(tm, "all_gather_object", no_collective)
    m = StepMetrics(SOLO)
    reads.clear()
    for _ in range(100):
        m.data_start()
        m.data_end()
        m.step_end(32)
    assert len(reads) == 300
    assert len(m._steps) == 100 and m._samples == 3200


# -- bytes ---------------------------------------------------------------------------------
def test_tensor_bytes_counts_numel_times_element_size():
    ts = [torch.zeros(3, 4), torch.zeros(5, dtype=torch.float64), torch.zeros(7, dtype=torch.int8), None]
    assert tensor_bytes(ts) == 3 * 4 * 4 + 5 * 8 + 7
    assert tensor_bytes(torch.zeros(2, 2, dtype=torch.bfloat16)) == 8
    assert tensor_bytes([]) == 0


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_state_bytes_with_adamw():
    model = mlp()
    n_params = 8 * 16 + 16 + 16 * 4 + 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert state_bytes(model, opt) == {"param_bytes": 4 * n_params, "grad_bytes": 0, "optim_bytes": 0}
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    s = state_bytes(model, opt)
    assert s["param_bytes"] == s["grad_bytes"] == 4 * n_params
    # exp_avg + exp_avg_sq (fp32, one each per element) + a 0-dim fp32 `step` per parameter tensor
    assert s["optim_bytes"] == 2 * s["param_bytes"] + 4 * len(list(model.parameters()))
    opt.zero_grad(set_to_none=True)
    assert state_bytes(model, opt)["grad_bytes"] == 0
    assert state_bytes(model, None)["optim_bytes"] == 0


# -- FLOPs, MFU ------------------------------------------------------------------------------
def test_flops_per_sample_on_linear_follows_the_counter_convention():
    # FlopCounterMode counts a multiply-add as 2: forward (B,in)x(in,out) = 2*B*in*out.
    # Backward: the weight grad costs the same again; the input grad is only computed
    # (another 2*in*out) when the input needs grad. Bias adds and the loss count 0.
    i, o, b = 8, 4, 5
    lin = nn.Linear(i, o)
    assert flops_per_sample(lin, torch.randn(b, i), lambda out: out.sum()) == 2 * (2 * i * o)
    assert flops_per_sample(lin, torch.randn(b, i, requires_grad=True), lambda out: out.sum()) == 3 * (2 * i * o)
    # An MLP: the first layer has no input grad, later ones do.
    assert flops_per_sample(mlp(), torch.randn(b, 8), lambda out: out.sum()) == 2 * (2 * 8 * 16) + 3 * (2 * 16 * 4)


def test_flops_per_sample_leaves_grads_buffers_and_rng_as_they_were():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.Linear(6, 3))
    model(torch.randn(4, 6)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    grad_values = [g.clone() for g in grads]
    bn = model[1]
    stats = (bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone())
    model[3].weight.grad = None  # a None grad stays None
    x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
    rng = torch.get_rng_state()
    f = flops_per_sample(model, x, lambda out: nn.functional.cross_entropy(out, y))
    assert f == 2 * (2 * 6 * 6) + 3 * (2 * 6 * 3)
    assert torch.equal(torch.get_rng_state(), rng)
    assert model[3].weight.grad is None
    for p, g, v in zip(list(model.parameters()), grads, grad_values):
        if p is not model[3].weight:
            assert p.grad is g and torch.equal(p.grad, v)
    assert torch.equal(bn.running_mean, stats[0]) and torch.equal(bn.running_var, stats[1])
    assert torch.equal(bn.num_batches_tracked, stats[2])


def test_mfu_arithmetic():
    assert mfu(1000.0, 2e9, 1e13) == pytest.approx(0.2)
    assert mfu(1000.0, 2e9, None) is None
    assert mfu(1000.0, 2e9, 0.0) is None


# -- devices ---------------------------------------------------------------------------------
def test_peak_memory_is_positive_on_cpu():
    peak = peak_memory_bytes(CPU)
    assert peak > 10 << 20  # a process with torch imported holds tens of MB
    assert peak_memory_bytes("cpu") >= peak  # a peak never goes down


def test_gpu_utilization_is_none_without_a_gpu_and_never_raises():
    assert gpu_utilization(CPU) is None
    assert gpu_utilization("not a device") is None


def test_forward_sync_counts_the_time_before_the_inner_forward_in_training_only(clock):
    class Wrapper(nn.Module):  # stands in for DDP: its own work (the buffer broadcast), then the module
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, x):
            clock.tick(0.05)
            return self.module(x)

    m = StepMetrics(SOLO)
    w = Wrapper(nn.Linear(2, 2))
    m._time_forward_sync(w)
    w(torch.zeros(1, 2))
    w.eval()
    w(torch.zeros(1, 2))  # evaluation forwards are not steps
    w.train()
    with torch.no_grad():
        w(torch.zeros(1, 2))
    assert m._local_stats()["forward_sync_s"] == pytest.approx(0.05)
    m.reset()
    assert m._local_stats()["forward_sync_s"] == 0.0
