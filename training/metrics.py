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
# The gradient all-reduce is timed by DDP's own runtime stats (C++ timers; CUDA events on GPU) on the
# iterations it samples (its first 10, then one in ``every``), read on one in ``every``. A Python comm
# hook would cost a call and a callback on the communication thread on every step; a read of the
# stats costs tens of microseconds, so it is spread over ``SAMPLE_PERIOD_S`` of training.
SAMPLE_PERIOD_S = 0.2
MAX_SAMPLE_EVERY = 64


def sample_every(step_s: float | None, window_steps: int = 0) -> int:
    """Time the all-reduce of one step in this many, for steps of ``step_s`` seconds (None: every
    step), below half of ``window_steps`` (when given) so that each window has two timed steps whose
    stats arrive within it (DDP records a step's stats at the next step's forward)."""
    if not step_s or step_s <= 0:
        return 1
    cap = min(MAX_SAMPLE_EVERY, max(1, (window_steps - 1) // 2)) if window_steps else MAX_SAMPLE_EVERY
    return max(1, min(cap, round(SAMPLE_PERIOD_S / step_s)))


class StepMetrics:
    """Per-rank step timing over a logging window, aggregated to rank 0.

    Per step it takes a few clock reads (data wait, step end; DDP's buffer broadcast only for a
    model with buffers); the gradient all-reduce comes from DDP's runtime stats on its sampled steps
    (the same steps on every rank); everything is summarised once per window in ``snapshot``."""

    COMM_TIMING = True  # False: no all-reduce timing (benchmarks/parity.py measures what it costs)

    def __init__(self, ctx: DistContext, straggler_ratio: float = 1.5):
        self.ctx, self.straggler_ratio = ctx, straggler_ratio
        self._t_data: float | None = None
        self._node_reporter = os.environ.get("LOCAL_RANK", "0") == "0"
        self._ddp = None  # the DDP module whose runtime stats time the all-reduce
        self._iteration = 0  # DDP's iteration count: synchronised training forwards so far
        self.every = 1  # DDP samples one iteration in this many (after its first 10); snapshot() sets it
        self.reset()

    def reset(self) -> None:
        """Start a new window now (``snapshot`` does this; call it where the loop really starts)."""
        now = self._window_t0 = self._last = _now()
        self._step_times: list[float] = []
        # At each step's end: (data wait, forward sync) so far, and the step's DDP iteration (0: none).
        self._step_marks: list[tuple[float, float, int]] = []
        self._comm: dict[int, float] = {}  # DDP iteration -> its all-reduce seconds (the sampled ones)
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
        self._last = now
        self._samples += n_samples
        if self._ddp is None:
            self._step_marks.append((self._data_wait, self._fwd_sync, 0))
            return
        self._iteration = it = self._iteration + 1
        self._step_marks.append((self._data_wait, self._fwd_sync, it))
        prev = it - 1  # its stats were recorded in this step's forward
        if prev >= 1 and prev % self.every == 0:
            self._read_comm(prev)

    def _read_comm(self, iteration: int) -> None:
        stats = self._ddp._get_ddp_logging_data()
        if stats.get("iteration") == iteration and stats.get("backward_comm_time") is not None:
            self._comm[iteration] = stats["backward_comm_time"] / 1e9  # ns

    def add_checkpoint_stall(self, seconds: float) -> None:
        self._ckpt_stall += seconds

    def attach_comm_hook(self, ddp_model) -> None:
        """Time a DDP ``ddp_model``'s gradient all-reduce (and, with buffers, its forward's buffer
        broadcast); call before its first forward. Adds no comm hook: the reducer's arithmetic is untouched."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not self.ctx.distributed or not isinstance(ddp_model, DDP):
            return
        if ddp_model.broadcast_buffers and any(True for _ in ddp_model.module.buffers()):
            self._time_forward_sync(ddp_model)  # without buffers DDP's forward has nothing to wait for
        if not self.COMM_TIMING:
            return
        if not hasattr(ddp_model, "_set_ddp_runtime_logging_sample_rate"):
            log.warning("this torch's DDP has no runtime stats: the all-reduce time is not measured")
            return
        self._ddp, self._iteration = ddp_model, 0
        ddp_model._set_ddp_runtime_logging_sample_rate(self.every)

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

    def _step_computes(self) -> list[float]:
        """Each timed step's time less its own data wait, forward sync and all-reduce time (every
        step when the all-reduce is not timed at all)."""
        out, prev = [], (0.0, 0.0, 0)
        for t, mark in zip(self._step_times, self._step_marks):
            comm = self._comm.get(mark[2]) if self._ddp is not None else 0.0
            if comm is not None:
                out.append(max(0.0, t - (mark[0] - prev[0]) - (mark[1] - prev[1]) - comm))
            prev = mark
        return out

    def _local_stats(self) -> dict:
        computes = self._step_computes()
        steps = len(self._step_times)
        mine = {m[2] for m in self._step_marks}
        timed = [c for it, c in self._comm.items() if it in mine]  # not the previous window's last step
        return {
            "rank": self.ctx.rank, "window_s": _now() - self._window_t0, "steps": steps,
            "samples": self._samples,
            "step_time_median_s": statistics.median(self._step_times) if self._step_times else None,
            "data_wait_s": self._data_wait, "compute_median_s": statistics.median(computes) if computes else None,
            # The timed steps' all-reduce time, and their median for each step not timed (one slow
            # first step, scaled up, would overstate the window).
            "allreduce_s": sum(timed) + (steps - len(timed)) * statistics.median(timed) if timed else 0.0,
            "allreduce_timed_steps": len(timed),
            "forward_sync_s": self._fwd_sync, "ckpt_stall_s": self._ckpt_stall,
            "peak_mem_bytes": peak_memory_bytes(self.ctx.device),
            "node": node_stats(self.ctx.device) if self._node_reporter else None,
        }

    def snapshot(self) -> dict | None:
        """COLLECTIVE: every rank must call it at the same point. Rank 0 gets ``aggregate``'s dict.
        Every rank then has DDP time one step in ``sample_every`` of the slowest rank's median step."""
        per_rank = all_gather_object(self.ctx, self._local_stats())
        self.every = sample_every(max((r["step_time_median_s"] or 0.0 for r in per_rank), default=None),
                                  max(r["steps"] for r in per_rank))
        if self._ddp is not None:
            self._ddp._set_ddp_runtime_logging_sample_rate(self.every)
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
