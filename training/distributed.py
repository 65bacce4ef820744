"""The one owner of the process group: setup, teardown and the few collectives we use."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from training.layouts import choose_backend


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    backend: str | None  # None: a single process without a process group
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _init(backend: str, rank: int, world: int, timeout: timedelta) -> None:
    """init_process_group; under a torchrun agent, on its store namespaced by the restart count:
    gloo's keys from a dead attempt stay in the agent's store, and a restarted group sometimes
    connected to them ("Gloo connectFullMesh failed", or a hang)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and addr and port:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        base = dist.TCPStore(addr, int(port), world_size=world, is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"trainflow/attempt_{attempt}", base)
        dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout)
    else:
        dist.init_process_group(backend=backend, timeout=timeout)


@contextmanager
def process_group(backend: str = "auto", timeout_s: float = 120.0) -> Iterator[DistContext]:
    """Join the torchrun world (env://), or run as one process outside torchrun; ``timeout_s`` bounds
    every collective. No collective teardown when the body raises (peers may be blocked in a
    collective this rank will never join): torchrun stops them."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    chosen = choose_backend(backend)
    if chosen == "nccl":
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if chosen == "nccl" else torch.device("cpu")
    if "TORCHELASTIC_RUN_ID" not in os.environ and world <= 1:
        yield DistContext(0, 0, 1, None, device)
        return
    _init(chosen, rank, world, timedelta(seconds=timeout_s))
    yield DistContext(rank, local_rank, world, chosen, device)
    # Together: destroying the group while a peer is still in flight can hang that peer at exit.
    dist.barrier()
    dist.destroy_process_group()


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (identity without a process group)."""
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather_object(ctx: DistContext, obj):
    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def all_gather_tensor(ctx: DistContext, t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's copy of a same-shape tensor, in rank order (one collective, no pickling)."""
    if not ctx.distributed:
        return [t.clone()]
    src = t.to(ctx.device) if ctx.backend == "nccl" else t
    out = [torch.empty_like(src) for _ in range(ctx.world_size)]
    dist.all_gather(out, src)
    return [o.cpu() for o in out]


def broadcast_object(ctx: DistContext, obj):
    """Rank 0's ``obj`` on every rank."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True on every rank when ``flag`` is True on at least one: the agreement primitive."""
    return all_reduce_sum(ctx, [1.0 if flag else 0.0])[0] > 0
