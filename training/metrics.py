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
    the mean over ranks of the time from the first gradient bucket sent to the last one back;
    ``data_wait_frac`` and ``ckpt_stall_s``: the worst rank's; ``per_rank``: ``rank_metrics`` and
    ``node_metrics``)."""
    ranks = sorted(per_rank, key=lambda r: r["rank"])
    window = max((r["window_s"] for r in ranks), default=0.0)
    samples = sum(r["samples"] for r in ranks)
    tokens = [r["tokens"] for r in ranks if r.get("tokens") is not None]
    medians = [r["step_time_median_s"] for r in ranks if r["step_time_median_s"] is not None]
    fracs = [min(1.0, r["data_wait_s"] / r["window_s"]) for r in ranks if r["window_s"] > 0]
    allreduce = statistics.fmean([r["allreduce_s"] for r in ranks]) if ranks else 0.0
    stall = max((r["ckpt_stall_s"] for r in ranks), default=0.0)

    def per_window(v: float) -> float:
        return v / window if window > 0 else 0.0

    return {
        "samples_per_s": per_window(samples),
        **({"tokens_per_s": per_window(sum(tokens))} if tokens else {}),
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


# -- per-rank window ----------------------------------------------------------------------
class StepMetrics:
    """Per-rank step timing over a logging window, aggregated to rank 0.

    Per step: a clock read in each of data_start, data_end and step_end, two in the forward-sync hooks,
    and one read of DDP's runtime stats (the all-reduce, timed by the reducer's own C++ timers); the
    rest once per window in ``snapshot``."""

    def __init__(self, ctx: DistContext, straggler_ratio: float = 1.5):
        self.ctx, self.straggler_ratio = ctx, straggler_ratio
        self._t_data: float | None = None
        self._node_reporter = os.environ.get("LOCAL_RANK", "0") == "0"
        self._ddp = None  # the DDP module whose runtime stats time the all-reduce
        self._iteration = 0  # the last DDP iteration whose all-reduce was read
        self.reset()

    def reset(self) -> None:
        """Start a new window now (``snapshot`` does this; call it where the loop really starts)."""
        now = self._window_t0 = self._last = _now()
        # Per step: [its seconds, its data wait + forward sync, its all-reduce seconds (None: not read)].
        self._steps: list[list] = []
        self._samples, self._data_wait, self._ckpt_stall, self._fwd_sync, self._allreduce = 0, 0.0, 0.0, 0.0, 0.0
        self._tokens = None  # a number, or a tensor summed on its device until the window reads it
        self._waits_before = 0.0
        if self._t_data is not None:  # a batch wait spanning the reset counts from the reset
            self._t_data = now

    def data_start(self) -> None:
        self._t_data = _now()

    def data_end(self) -> None:
        if self._t_data is not None:
            self._data_wait += _now() - self._t_data
            self._t_data = None

    def step_end(self, n_samples: int, tokens=None) -> None:
        now = _now()
        waits = self._data_wait + self._fwd_sync
        self._steps.append([now - self._last, waits - self._waits_before, None])
        self._waits_before, self._last = waits, now
        self._samples += n_samples
        if tokens is not None:
            self._tokens = tokens if self._tokens is None else self._tokens + tokens
        if self._ddp is not None:
            self._read_allreduce()

    def _read_allreduce(self) -> None:
        """The previous step's all-reduce seconds: DDP records a step's stats at the next training forward,
        so a window's all-reduce is that of its steps each one step late."""
        stats = self._ddp._get_ddp_logging_data()
        iteration, ns = stats.get("iteration", 0), stats.get("backward_comm_time")
        if ns is None or iteration <= self._iteration:
            return
        self._iteration = iteration
        self._allreduce += ns / 1e9
        if len(self._steps) > 1:  # else the previous window's last step
            self._steps[-2][2] = ns / 1e9

    def add_checkpoint_stall(self, seconds: float) -> None:
        self._ckpt_stall += seconds

    def attach(self, ddp_model) -> None:
        """Time a DDP ``ddp_model``'s gradient all-reduce and (with buffers) its buffer broadcast; call
        before its first forward. The all-reduce comes from DDP's runtime stats on every step, not a comm
        hook: a Python hook adds a call, and a callback on the communication thread, to every step, and
        the reducer's arithmetic stays its own. On CUDA DDP waits for a step's timing events at the next
        step's forward, when they are normally done."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        if not self.ctx.distributed or not isinstance(ddp_model, DDP):
            return
        ddp_model._set_ddp_runtime_logging_sample_rate(1)
        self._ddp = ddp_model
        if ddp_model.broadcast_buffers and any(True for _ in ddp_model.module.buffers()):
            self._time_forward_sync(ddp_model)  # without buffers DDP's forward has nothing to wait for

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

    def _local_stats(self) -> dict:
        # Each step less its own waits; under DDP only the steps whose all-reduce has been read.
        computes = [max(0.0, t - w - (c or 0.0)) for t, w, c in self._steps if c is not None or self._ddp is None]
        times = [s[0] for s in self._steps]
        return {
            "rank": self.ctx.rank, "window_s": _now() - self._window_t0, "steps": len(times),
            "samples": self._samples, "step_time_median_s": statistics.median(times) if times else None,
            "tokens": None if self._tokens is None else float(self._tokens),
            "data_wait_s": self._data_wait, "compute_median_s": statistics.median(computes) if computes else None,
            "allreduce_s": self._allreduce, "forward_sync_s": self._fwd_sync, "ckpt_stall_s": self._ckpt_stall,
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
