"""Data-parallel strategies behind one small API: single process, DDP, or FSDP2 (``fully_shard``).

``ddp`` without a process group is ``single``; ``fsdp`` shards parameters, gradients and optimizer
state on dim 0. Methods marked COLLECTIVE must be called by every rank, in the same order.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import ContextManager, Iterator

import torch
from torch import nn

from training.distributed import DistContext
# The launch-time checks live in a torch-free module (the pipeline process uses them without torch).
from training.layouts import (MODEL_PARALLEL, PRECISIONS, StrategyConfigError, check_world,  # noqa: F401
                              layout_for, mismatch_error)


def uncompiled(module: nn.Module) -> nn.Module:
    """``module`` without a ``torch.compile`` wrapper (its ``_orig_mod``): checkpoints, exports and
    registered weights use the plain module's keys, not ``_orig_mod.``-prefixed ones."""
    # A compile wrapper exists only once dynamo is imported: an eager run never pays for its import.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    if eval_frame is not None and isinstance(module, eval_frame.OptimizedModule):
        return module._orig_mod
    return module


class Strategy:
    """Base: a replicated model (every rank holds all of it). Subclasses override what differs."""

    name: str = "base"
    # Replicated state: rank 0 writes it alone from a CPU snapshot, in the checkpointer's
    # background thread; False: every rank writes its shards, together.
    async_save: bool = True
    task = None  # the ``tasks.base.Task`` whose loss and accuracy count; the Trainer sets it

    def __init__(self, ctx: DistContext, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise StrategyConfigError(
                f"training.precision: must be one of {', '.join(repr(p) for p in PRECISIONS)}, got {precision!r}")
        self.ctx, self.precision = ctx, precision
        # Which batches this rank trains on (its index among the data-parallel replicas), and whether
        # its loss, accuracy and sample counts enter the all-reduced sums.
        self.dp_rank, self.dp_size, self.reports = ctx.rank, ctx.world_size, True

    def __repr__(self) -> str:
        return f"{type(self).__name__}(world_size={self.ctx.world_size}, precision={self.precision!r})"

    @property
    def _bf16_cuda(self) -> bool:
        return self.precision == "bf16" and self.ctx.device.type == "cuda"

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def unwrapped(self, wrapped: nn.Module) -> nn.Module:
        return uncompiled(wrapped)

    def compile(self, wrapped: nn.Module, mode: str = "default", backend: str = "inductor") -> nn.Module:
        """``torch.compile`` of what ``wrap`` returned, outermost (after DDP / ``fully_shard``, as
        torch's notes ask); parameters stay the same objects."""
        return torch.compile(wrapped, mode=None if mode == "default" else mode, backend=backend)

    def release(self) -> None:
        """Drop what the strategy holds of the model (before the process group goes)."""

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        return nullcontext()

    def autocast(self) -> ContextManager:
        """bf16 autocast on CUDA; nothing on CPU or in fp32."""
        return torch.autocast("cuda", dtype=torch.bfloat16) if self._bf16_cuda else nullcontext()

    def layout(self) -> dict:
        """How the model is laid out over ranks; stored in checkpoints."""
        return layout_for(self.name, self.ctx.world_size)

    def rank_info(self) -> dict:
        """This rank's coordinates in the layout (result.json's per-rank records)."""
        return {}

    def forward_backward(self, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float) -> float:
        """Forward, then backward of the summed per-sample loss times ``scale``; returns that sum. ``x``
        may have 0 rows (an epoch's last step): both still run, so every rank joins the collectives."""
        # A 0-row batch runs uncompiled (still through DDP/FSDP): inductor's CPU convolution
        # backward fails on 0 rows, and the shape would cost a recompile anyway.
        model = wrapped if len(x) else uncompiled(wrapped)
        with self.autocast():
            total = self.task.loss(model(x), y, reduction="sum") / math.prod(y.shape[1:])
            (total * scale).backward()
        return total.item()

    def eval_sums(self, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor,
                  outputs: list | None = None) -> tuple[float, float, int]:
        """(summed loss, correct predictions, targets) of this rank's eval slice; call under no_grad.
        ``outputs``: a list that also receives the slice's fp32 CPU outputs (the task scores them)."""
        with self.autocast():
            logits = (wrapped if len(x) else uncompiled(wrapped))(x)  # as in forward_backward
            loss_sum = self.task.loss(logits, y, reduction="sum").item() if len(y) else 0.0
            correct = self.task.val_correct(logits, y)
        if outputs is not None:
            outputs.append(logits.detach().float().cpu())
        return loss_sum, correct, y.numel()

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float:
        """Clip all gradients to ``max_norm`` (global L2 norm over all ranks' shards); returns that norm."""
        from torch.distributed.tensor import DTensor

        total = torch.nn.utils.clip_grad_norm_(wrapped.parameters(), max_norm)
        if isinstance(total, DTensor):
            total = total.full_tensor()  # collective under fsdp: every rank calls clip_grad_norm
        return float(total)

    def full_state_dict(self, wrapped: nn.Module) -> dict | None:
        """COLLECTIVE. Rank 0: a full CPU copy of the model's state dict; other ranks: None."""
        if not self.ctx.is_main:
            return None
        return {k: v.detach().to("cpu", copy=True) for k, v in self.unwrapped(wrapped).state_dict().items()}

    def checkpoint_module(self, wrapped: nn.Module) -> nn.Module:
        """The module whose state ``get_state_dict`` reads: the plain model (replicated state)."""
        return self.unwrapped(wrapped)

    def state_dict_options(self):
        """``StateDictOptions`` for get/set_state_dict (None: the defaults)."""
        return None

    def check_layout(self, extra: dict, folder: Path) -> None:
        """Raise ``mismatch_error``'s error when ``folder``'s shards cannot load into this layout."""
        if error := mismatch_error(folder, (extra or {}).get("layout"), self.layout()):
            raise error


class SingleStrategy(Strategy):
    name = "single"


class DDPStrategy(Strategy):
    """``DistributedDataParallel``; without a process group, the model as is (like ``single``)."""

    name = "ddp"

    def wrap(self, model: nn.Module) -> nn.Module:
        if not self.ctx.distributed:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[self.ctx.device.index] if self.ctx.device.type == "cuda" else None)

    def unwrapped(self, wrapped: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = uncompiled(wrapped)
        return wrapped.module if isinstance(wrapped, DDP) else wrapped

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = uncompiled(wrapped)  # no_sync is DDP's, under a compile wrapper too
        return nullcontext() if sync or not isinstance(wrapped, DDP) else wrapped.no_sync()


def _shard_targets(model: nn.Module) -> list[nn.Module]:
    """Submodules that get their own FSDP unit: every Linear/Conv, else each direct child with parameters."""
    from torch.nn.modules.conv import _ConvNd

    layers = [m for m in model.modules() if m is not model and isinstance(m, (nn.Linear, _ConvNd))]
    return layers or [c for c in model.children() if next(c.parameters(), None) is not None]


@contextmanager
def fsdp_gradient_sync(wrapped: nn.Module, sync: bool) -> Iterator[None]:
    """FSDP2's no_sync: reduce-scatter gradients only when ``sync`` (grad accumulation's last step)."""
    wrapped.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        wrapped.set_requires_gradient_sync(True)


class DCPStrategy(Strategy):
    """Base of the sharded strategies: every rank saves and loads its own shards."""

    async_save = False

    def __init__(self, ctx: DistContext, precision: str = "fp32"):
        super().__init__(ctx, precision)
        if not ctx.distributed:
            raise StrategyConfigError(
                f"training.strategy: {self.name!r} needs a process group (launch with torchrun), "
                "this process has none")

    def checkpoint_module(self, wrapped: nn.Module) -> nn.Module:
        return wrapped  # its DTensor shards, which each rank writes

    def full_state_dict(self, wrapped: nn.Module) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return sd if self.ctx.is_main else None


class FSDPStrategy(DCPStrategy):
    """FSDP2: ``fully_shard`` per unit the task names (``Task.fsdp_units``: a transformer's blocks), else
    per Linear/Conv layer, then the root."""

    name = "fsdp"

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.ctx.device.type, (self.ctx.world_size,))
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if self._bf16_cuda
              else MixedPrecisionPolicy())
        units = self.task.fsdp_units(model) if self.task is not None else None
        for module in [*(units or _shard_targets(model)), model]:
            fully_shard(module, mesh=mesh, mp_policy=mp)
        return model

    def autocast(self) -> ContextManager:
        return nullcontext()  # bf16 on CUDA is the MixedPrecisionPolicy's casts

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        return fsdp_gradient_sync(uncompiled(wrapped), sync)
