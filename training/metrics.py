"""Training-performance metrics: step timing, data wait, all-reduce time, memory, FLOPs.

``StepMetrics`` is fed by the loop on every rank (clock reads and appends, no collectives) and
aggregated to rank 0 once per logging window by ``snapshot()``, the only collective here; the
aggregation is the pure function ``aggregate``.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from training.distributed import DistContext, all_gather_object

log = logging.getLogger("trainflow.train")

_now = time.perf_counter
_MB = float(1 << 20)


# -- aggregation (pure) -------------------------------------------------------------------
# A straggler must also be this much slower per step: on steps of a few ms, noise alone makes ratios of 1.5.
STRAGGLER_MIN_LAG_S = 1e-3


def compute_per_step_s(r: dict) -> float | None:
    """A rank's compute seconds per step (None: no step): its steps' median time less their own waits
    (data, DDP buffer broadcast, all-reduce). Under DDP step times are equal; the waits tell ranks apart."""
    steps = r.get("steps") or 0
    if not steps or r.get("step_time_median_s") is None:
        return None
    if r.get("compute_median_s") is not None:
        return r["compute_median_s"]
    waits = r.get("data_wait_s", 0.0) + r.get("allreduce_s", 0.0) + r.get("forward_sync_s", 0.0)
    return max(0.0, r["step_time_median_s"] - waits / steps)


def find_straggler(per_rank: list[dict], ratio: float) -> dict:
    """The straggler rule on ``compute_per_step_s``: the slowest rank is one when its compute exceeds
    the median of the *other* ranks' by more than ``ratio`` (strictly) and by more than ``STRAGGLER_MIN_LAG_S``.
    Returns ``straggler``, ``straggler_rank``, ``straggler_ratio``, ``straggler_lag_ms``."""
    compute = [(c, r["rank"]) for r in per_rank if (c := compute_per_step_s(r)) is not None]
    if len(compute) < 2:
        return {"straggler": False, "straggler_rank": None, "straggler_ratio": None, "straggler_lag_ms": None}
    slow, rank = max(compute)
    others = statistics.median([c for c, rk in compute if rk != rank])
    lag = slow - others
    measured = slow / others if others > 0 else math.inf
    flagged = measured > ratio and lag > STRAGGLER_MIN_LAG_S
    return {"straggler": bool(flagged), "straggler_rank": rank if flagged else None,
            "straggler_ratio": measured if math.isfinite(measured) else None, "straggler_lag_ms": lag * 1e3}


def rank_metrics(per_rank: list[dict]) -> dict[str, float]:
    """Every rank's own numbers as ``rank/<r>/<name>``; a rank that ran no step has only ``peak_mem_mb``."""
    out: dict[str, float] = {}
    for r in sorted(per_rank, key=lambda r: r["rank"]):
        p = f"rank/{r['rank']}/"
        if (compute := compute_per_step_s(r)) is not None:
            steps = r["steps"]
            out[p + "step_time_ms"] = r["step_time_median_s"] * 1e3
            out[p + "data_wait_ms"] = r["data_wait_s"] / steps * 1e3
            out[p + "allreduce_wait_ms"] = r["allreduce_s"] / steps * 1e3
            out[p + "forward_sync_ms"] = r.get("forward_sync_s", 0.0) / steps * 1e3
            out[p + "compute_ms"] = compute * 1e3
        out[p + "peak_mem_mb"] = r["peak_mem_bytes"] / _MB
    return out


def node_metrics(per_rank: list[dict]) -> dict[str, float]:
    """The per-node system numbers some ranks carry (``node_stats``) as ``node/<n>/<name>``."""
    return {f"node/{node['node']}/{k}": float(v) for r in per_rank if (node := r.get("node"))
            for k, v in node.items() if k != "node" and v is not None}


def aggregate(per_rank: list[dict], straggler_ratio: float = 1.5) -> dict:
    """Combine each rank's window stats (``StepMetrics._local_stats``) into one summary (``allreduce_s``:
    the mean over ranks of the time some gradient bucket was in flight; ``data_wait_frac`` and
    ``ckpt_stall_s``: the worst rank's; ``per_rank``: ``rank_metrics`` and ``node_metrics``)."""
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    window = max((r["window_s"] for r in ranks), default=0.0)
    samples = sum(r["samples"] for r in ranks)
    medians = [r["step_time_median_s"] for r in ranks if r["step_time_median_s"] is not None]
    fracs = [min(1.0, r["data_wait_s"] / r["window_s"]) for r in ranks if r["window_s"] > 0]
    allreduce = statistics.fmean([r["allreduce_s"] for r in ranks]) if ranks else 0.0
    stall = max((r["ckpt_stall_s"] for r in ranks), default=0.0)

    def per_window(v: float) -> float:
        return v / window if window > 0 else 0.0

    return {
        "samples_per_s": per_window(samples),
        "step_time_min_ms": min(medians) * 1e3 if medians else None,
        "step_time_median_ms": statistics.median(medians) * 1e3 if medians else None,
        "step_time_max_ms": max(medians) * 1e3 if medians else None,
        **find_straggler(ranks, straggler_ratio),
        "data_wait_frac": max(fracs, default=0.0),
        "allreduce_s": allreduce, "allreduce_frac": per_window(allreduce),
        "ckpt_stall_s": stall, "ckpt_stall_frac": per_window(stall),
        "peak_mem_mb": [r["peak_mem_bytes"] / _MB for r in ranks],
        "steps": max((r["steps"] for r in ranks), default=0),
        "window_s": window,
        "per_rank": {**rank_metrics(ranks), **node_metrics(ranks)},
    }


def busy_seconds(spans: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals."""
    total, reached = 0.0, -math.inf
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


# -- per-rank window ----------------------------------------------------------------------
class StepMetrics:
    """Per-rank step timing over a logging window, aggregated to rank 0."""

    def __init__(self, ctx: DistContext, straggler_ratio: float = 1.5):
        self.ctx, self.straggler_ratio = ctx, straggler_ratio
        self._cuda_timing = ctx.device.type == "cuda"
        self._t_data: float | None = None
        self._node_reporter = os.environ.get("LOCAL_RANK", "0") == "0"
        self.reset()

    def reset(self) -> None:
        """Start a new window now (``snapshot`` does this; call it where the loop really starts)."""
        now = self._window_t0 = self._last = _now()
        self._step_times: list[float] = []
        # At each step's end: (data wait, forward sync, all-reduce spans) so far (``_step_computes``).
        self._step_marks: list[tuple[float, float, int]] = []
        self._allreduce: list = []  # (start, end): perf_counter seconds, or CUDA events
        self._samples, self._data_wait, self._ckpt_stall, self._fwd_sync = 0, 0.0, 0.0, 0.0
        if self._t_data is not None:  # a batch wait spanning the reset counts from the reset
            self._t_data = now

    def data_start(self) -> None:
        self._t_data = _now()

    def data_end(self) -> None:
        if self._t_data is not None:
            self._data_wait += _now() - self._t_data
            self._t_data = None

    def step_end(self, n_samples: int) -> None:
        now = _now()
        self._step_times.append(now - self._last)
        self._step_marks.append((self._data_wait, self._fwd_sync, len(self._allreduce)))
        self._last = now
        self._samples += n_samples

    def add_checkpoint_stall(self, seconds: float) -> None:
        self._ckpt_stall += seconds

    def attach_comm_hook(self, ddp_model) -> None:
        """Register a timing all-reduce comm hook on a DDP ``ddp_model`` before its first backward;
        bitwise the same as none: ``mul_(1 / world_size)`` as the reducer does (``div_`` can differ)."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not self.ctx.distributed or not isinstance(ddp_model, DDP):
            return
        import torch.distributed as dist

        group = ddp_model.process_group
        inv_world = 1.0 / group.size()
        metrics, cuda = self, self._cuda_timing

        def mark():
            if not cuda:
                return _now()
            # A CUDA event: the NCCL future completes at enqueue, so host time would read ~0.
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        # No annotations: DDP checks them by identity, and postponed (string) annotations fail it.
        def timed_allreduce_hook(state, bucket):
            buf = bucket.buffer()
            start = mark()
            buf.mul_(inv_world)
            fut = dist.all_reduce(buf, group=state, async_op=True).get_future()

            def done(f):
                metrics._allreduce.append((start, mark()))
                return f.value()[0]

            return fut.then(done)

        ddp_model.register_comm_hook(state=group, hook=timed_allreduce_hook)
        self._time_forward_sync(ddp_model)

    def _time_forward_sync(self, ddp_model) -> None:
        """Time DDP's buffer broadcast before each training forward: with buffers, a slow rank's peers
        wait for it there rather than in the all-reduce (host time: on CUDA it reads ~0)."""
        metrics = self
        entered: list[float] = []

        def outer(module, args):
            entered[:] = [_now()] if module.training and torch.is_grad_enabled() else []

        def inner(module, args):
            if entered:
                metrics._fwd_sync += _now() - entered.pop()

        ddp_model.register_forward_pre_hook(outer)
        ddp_model.module.register_forward_pre_hook(inner)

    def _allreduce_spans(self) -> list[tuple[float, float]]:
        """The window's all-reduce spans in seconds (on CUDA, waits for the last event)."""
        spans = list(self._allreduce)
        if self._cuda_timing and spans:
            ref = spans[0][0]
            for _, end in spans:
                end.synchronize()
            spans = [(ref.elapsed_time(s) / 1e3, ref.elapsed_time(e) / 1e3) for s, e in spans]
        return spans

    def _step_computes(self, spans: list[tuple[float, float]]) -> list[float]:
        """Each step's time less its own data wait, forward sync and all-reduce (busy) time."""
        out, prev = [], (0.0, 0.0, 0)
        for t, mark in zip(self._step_times, self._step_marks):
            waits = mark[0] - prev[0] + mark[1] - prev[1] + busy_seconds(spans[prev[2]:mark[2]])
            out.append(max(0.0, t - waits))
            prev = mark
        return out

    def _local_stats(self) -> dict:
        spans = self._allreduce_spans()
        computes = self._step_computes(spans)
        return {
            "rank": self.ctx.rank, "window_s": _now() - self._window_t0, "steps": len(self._step_times),
            "samples": self._samples,
            "step_time_median_s": statistics.median(self._step_times) if self._step_times else None,
            "data_wait_s": self._data_wait, "compute_median_s": statistics.median(computes) if computes else None,
            "allreduce_s": busy_seconds(spans), "forward_sync_s": self._fwd_sync, "ckpt_stall_s": self._ckpt_stall,
            "peak_mem_bytes": peak_memory_bytes(self.ctx.device),
            "node": node_stats(self.ctx.device) if self._node_reporter else None,
        }

    def snapshot(self) -> dict | None:
        """COLLECTIVE: every rank must call it at the same point. Rank 0 gets ``aggregate``'s dict."""
        per_rank = all_gather_object(self.ctx, self._local_stats())
        self.reset()
        if self.ctx.rank != 0:
            return None
        summary = aggregate(per_rank, self.straggler_ratio)
        if summary["straggler"]:
            r = summary["straggler_rank"]
            log.warning("straggler: rank %s computes %.1f ms a step, %.1f ms more than the other ranks' median "
                        "(x%s > x%.2f); the others wait for it in their collectives",
                        r, summary["per_rank"][f"rank/{r}/compute_ms"], summary["straggler_lag_ms"],
                        "inf" if summary["straggler_ratio"] is None else f"{summary['straggler_ratio']:.2f}",
                        self.straggler_ratio)
        return summary


# -- memory ------------------------------------------------------------------------------
def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process (lifetime, not per window): CUDA ``max_memory_allocated`` or peak RSS."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS: bytes; Linux: KiB


def node_stats(device: torch.device) -> dict:
    """This node's system numbers (read by local rank 0 once a window): ``node`` (``GROUP_RANK``),
    ``cpu_util_pct`` (since the previous call), ``mem_used_mb``; on CUDA ``gpu_util_pct`` (mean) and
    ``gpu_mem_used_mb`` (sum) from NVML. A number that cannot be read is left out, never raised."""
    out: dict[str, Any] = {"node": int(os.environ.get("GROUP_RANK", "0"))}
    try:
        import psutil

        out["cpu_util_pct"] = float(psutil.cpu_percent(interval=None))
        out["mem_used_mb"] = psutil.virtual_memory().used / _MB
    except Exception:  # psutil missing or unreadable /proc
        pass
    try:
        if torch.device(device).type == "cuda" and torch.cuda.is_available():
            n = torch.cuda.device_count()
            out["gpu_util_pct"] = statistics.fmean(float(torch.cuda.utilization(i)) for i in range(n))
            out["gpu_mem_used_mb"] = sum(torch.cuda.device_memory_used(i) for i in range(n)) / _MB
    except Exception:  # no pynvml, an NVML error
        pass
    return out


def tensor_bytes(tensors: torch.Tensor | Iterable[Any]) -> int:
    """Sum of ``numel * element_size``; a DTensor counts its local shard; non-tensors (None) are skipped."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", ())  # none before its import
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else tensors
    local = [t.to_local() if isinstance(t, dtensor) else t for t in tensors if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in local)


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Bytes held on this rank by parameters, their grads and the optimizer state tensors."""
    params = list(model.parameters())
    states = optimizer.state.values() if optimizer is not None else []
    return {
        "param_bytes": tensor_bytes(params),
        "grad_bytes": tensor_bytes(p.grad for p in params),
        "optim_bytes": sum(tensor_bytes(st.values() if isinstance(st, dict) else [st]) for st in states),
    }


# -- compute -----------------------------------------------------------------------------
def flops_per_sample(model: torch.nn.Module, example_batch: torch.Tensor,
                     loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """FLOPs of one forward + backward per sample, counted by ``FlopCounterMode`` (``loss_fn(output)``:
    a scalar). Grads, buffers and the RNG state are restored; a DDP wrapper is unwrapped (its
    backward would all-reduce on this rank alone); not for an FSDP module."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.flop_counter import FlopCounterMode

    if isinstance(model, DDP):
        model = model.module
    n = int(example_batch.shape[0])
    if n == 0:
        raise ValueError("example_batch is empty")
    params = list(model.parameters())
    saved_grads = [p.grad for p in params]
    saved_buffers = [b.detach().clone() for b in model.buffers()]
    dev = example_batch.device
    devices = [torch.cuda.current_device() if dev.index is None else dev.index] if dev.type == "cuda" else []
    try:
        for p in params:
            p.grad = None
        with torch.random.fork_rng(devices=devices), FlopCounterMode(display=False) as counter:
            loss_fn(model(example_batch)).backward()
        total = counter.get_total_flops()
    finally:
        for p, g in zip(params, saved_grads):
            p.grad = g
        with torch.no_grad():
            for b, saved in zip(model.buffers(), saved_buffers):
                b.copy_(saved)
    return total / n


def mfu(samples_per_s: float, flops_per_sample: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization: achieved FLOP/s over ``peak_flops`` (same scope); None without a peak."""
    if not peak_flops or peak_flops <= 0:
        return None
    return samples_per_s * flops_per_sample / peak_flops


def gpu_utilization(device) -> float | None:
    """Percent GPU busy over the last sample period (NVML), or None (CPU, no pynvml, any error)."""
    try:
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            return None
        import pynvml  # noqa: F401  (torch.cuda.utilization needs it)

        return float(torch.cuda.utilization(device))
    except Exception:
        return None
