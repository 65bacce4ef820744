"""Model parallelism (``tp``, ``pp``, ``hybrid``: data x tensor) and ``build_strategy``, which builds every
strategy. How the model splits is the task's ``tasks.base.ParallelPlan``; each is a ``DCPStrategy``
whose checkpoints resume only into the same layout.

- ``tp``: each block's Linears split by column or row across all ranks (DTensor on a 1-D mesh).
- ``hybrid``: a 2-D mesh ``(dp, tp)``, rank = dp_rank * tp + tp_rank: TP in each row, FSDP2 over ``dp``.
- ``pp``: rank r runs stage r under ``torch.distributed.pipelining`` GPipe or 1F1B; the last stage
  computes and reports the loss and eval sums.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import ContextManager

import torch
from torch import nn

from training.distributed import DistContext
from training.strategies import (MODEL_PARALLEL, DCPStrategy, DDPStrategy, FSDPStrategy, SingleStrategy, Strategy,
                                 StrategyConfigError, check_world, fsdp_gradient_sync, layout_for)


class _ModelParallel(DCPStrategy):
    """What tp, pp and hybrid share: degrees, layout, layout check, global-norm clipping."""

    def __init__(self, ctx: DistContext, precision: str, parallel, plan):
        super().__init__(ctx, precision)
        if plan is None:
            raise StrategyConfigError(f"training.strategy: {self.name!r} (model parallel) needs a task whose model "
                                      "splits across ranks (a tasks.base.ParallelPlan); this one has none")
        self.plan, self.parallel, self.tp, self.pp = plan, parallel, parallel.tp, parallel.pp
        self.dp = ctx.world_size // (self.tp * self.pp)

    def layout(self) -> dict:
        return layout_for(self.name, self.ctx.world_size, self.parallel)

    def state_dict_options(self):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # Param groups keyed per parameter: stages hold different parameters, and the nested default
        # ("param_groups.0.params") would be one key that DCP keeps from one rank only.
        return StateDictOptions(flatten_optimizer_state_dict=True)

    _plain_replicas = 1  # a stage's parameters live on its rank only

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float:
        """COLLECTIVE. Clip gradients to a global L2 norm of ``max_norm``; returns the norm before clipping.
        Each local square sum counts once: divided by how many ranks hold the same values."""
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        grads = [p.grad for p in wrapped.parameters() if p.grad is not None]
        sq = torch.zeros((), dtype=torch.float64)
        for g in grads:
            if isinstance(g, DTensor):
                mesh = g.device_mesh
                replicas = self.ctx.world_size // mesh.size()
                for dim, placement in enumerate(g.placements):
                    if placement.is_replicate():
                        replicas *= mesh.size(dim)
                local = g.to_local()
            else:
                replicas, local = self._plain_replicas, g
            sq += local.detach().double().pow(2).sum() / replicas
        dist.all_reduce(sq)
        total = float(sq.sqrt().float())
        coef = min(1.0, max_norm / (total + 1e-6))
        with torch.no_grad():
            for g in grads:
                (g.to_local() if isinstance(g, DTensor) else g).mul_(coef)
        return total


class TensorParallelStrategy(_ModelParallel):
    """tp (dp 1) and hybrid (dp > 1: FSDP2 over the dp dimension of a 2-D mesh)."""

    name = "tp"

    def __init__(self, ctx: DistContext, precision: str, parallel, plan):
        super().__init__(ctx, precision, parallel, plan)
        self.tp_rank = ctx.rank % self.tp
        self.dp_rank, self.dp_size, self.reports = ctx.rank // self.tp, self.dp, self.tp_rank == 0
        self._plain_replicas = ctx.world_size  # replicated modules: every rank holds the same grads

    def rank_info(self) -> dict:
        return {"dp_rank": self.dp_rank, "tp_rank": self.tp_rank, "pp_stage": 0}

    def wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        dev = self.ctx.device.type
        if self.dp == 1:
            tp_mesh, dp_mesh = init_device_mesh(dev, (self.tp,), mesh_dim_names=("tp",)), None
        else:
            mesh = init_device_mesh(dev, (self.dp, self.tp), mesh_dim_names=("dp", "tp"))
            tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
        blocks = self.plan.blocks(model)
        for block in blocks:
            parallelize_module(block, tp_mesh, self.plan.block_plan())
        if dp_mesh is not None:
            from torch.distributed.fsdp import fully_shard

            for module in [*blocks, model]:
                fully_shard(module, mesh=dp_mesh)
        return model

    def sync_context(self, wrapped: nn.Module, sync: bool) -> ContextManager:
        return fsdp_gradient_sync(wrapped, sync) if self.dp > 1 else nullcontext()


class HybridStrategy(TensorParallelStrategy):
    name = "hybrid"


class PipelineStrategy(_ModelParallel):
    """pp: rank r runs pipeline stage r; micro-batched GPipe or 1F1B schedules."""

    name = "pp"

    def __init__(self, ctx: DistContext, precision: str, parallel, plan, batch_size: int = 0):
        super().__init__(ctx, precision, parallel, plan)
        self.stage_index = ctx.rank
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.pp - 1
        self.eval_chunk = batch_size
        self.module: nn.Module | None = None
        self._schedules: dict = {}
        self._scale = 1.0
        self._n_layers = 0
        self.dp_rank, self.dp_size, self.reports = 0, 1, self.is_last  # every stage sees the same batches

    def rank_info(self) -> dict:
        return {"dp_rank": 0, "tp_rank": 0, "pp_stage": self.stage_index,
                "stage_layers": self.plan.stage_layers(self._n_layers, self.pp)[self.stage_index]}

    def wrap(self, model: nn.Module) -> nn.Module:
        self._n_layers = len(self.plan.blocks(model))
        self.module = self.plan.split_stage(model, self.stage_index, self.pp)
        return self.module

    def _loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Summed per-sample loss x the trainer's scale: summed over micro-batches, the step's mean.
        return self.task.loss(out, target, reduction="sum") / target[0].numel() * self._scale

    def _schedule(self, size: int, train: bool):
        """(schedule, micro-batches) for a batch of ``size`` rows: one stage + schedule per shape, as
        stages infer activation shapes from their first micro-batch."""
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        n = max(d for d in range(1, min(size, self.parallel.microbatches) + 1) if size % d == 0)
        key = (size, n, train)
        if key not in self._schedules:
            stage = PipelineStage(self.module, self.stage_index, self.pp, self.ctx.device)
            use_1f1b = train and self.parallel.schedule == "1f1b" and n >= self.pp
            cls = Schedule1F1B if use_1f1b else ScheduleGPipe
            self._schedules[key] = cls(stage, n, loss_fn=self._loss if train else None, scale_grads=False)
        return self._schedules[key], n

    def forward_backward(self, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float) -> float:
        """COLLECTIVE (point-to-point along the pipeline). The summed per-sample loss on the last
        stage, 0 elsewhere. Every stage sees the same batch, so an empty one is skipped by all."""
        if len(x) == 0:
            return 0.0
        sched, n = self._schedule(len(x), train=True)
        self._scale = scale
        losses: list = []
        with self.autocast():
            if self.is_first:
                sched.step(x, return_outputs=False)
            elif self.is_last:
                sched.step(target=y, losses=losses, return_outputs=False)
            else:
                sched.step(return_outputs=False)
        if not self.is_last:
            return 0.0
        return float(torch.stack([loss.detach() for loss in losses]).sum()) / scale

    def eval_sums(self, wrapped: nn.Module, x: torch.Tensor, y: torch.Tensor,
                  outputs: list | None = None) -> tuple[float, float, int]:
        """COLLECTIVE. Forward-only pipeline over chunks of the eval slice; sums (and ``outputs``, fp32
        CPU) on the last stage."""
        loss_sum, correct, n_targets = 0.0, 0.0, 0
        chunk = self.eval_chunk or max(len(x), 1)  # an empty slice: no chunk, no collective
        for start in range(0, len(x), chunk):
            xb, yb = x[start:start + chunk], y[start:start + chunk]
            sched, _ = self._schedule(len(xb), train=False)
            with self.autocast():
                if self.is_first:
                    sched.eval(xb)
                elif self.is_last:
                    logits = sched.eval()
                    loss_sum += self.task.loss(logits, yb, reduction="sum").item()
                    correct += self.task.val_correct(logits, yb)
                    n_targets += yb.numel()
                    if outputs is not None:
                        outputs.append(logits.detach().float().cpu())
                else:
                    sched.eval()
        return loss_sum, correct, n_targets

    def full_state_dict(self, wrapped: nn.Module) -> dict | None:
        """COLLECTIVE. Every stage's state dict gathered to rank 0 and merged (same keys as a plain LM)."""
        import torch.distributed as dist

        mine = {k: v.detach().to("cpu", copy=True) for k, v in self.module.state_dict().items()}
        gathered = [None] * self.ctx.world_size if self.ctx.is_main else None
        dist.gather_object(mine, gathered, dst=0)
        return {k: v for part in gathered for k, v in part.items()} if self.ctx.is_main else None

    def release(self) -> None:
        self._schedules.clear()
        self.module = None


def build_strategy(name: str, ctx: DistContext, precision: str = "fp32", parallel=None,
                   plan=None, batch_size: int = 0) -> Strategy:
    """The strategy ``name`` for this process; raises ValueError (a ConfigError) naming the key.
    tp / pp / hybrid need ``parallel`` (``ParallelConfig``) and the task's ``plan`` (``ParallelPlan``)."""
    check_world(name, ctx.world_size, parallel)
    if name == "pp":
        return PipelineStrategy(ctx, precision, parallel, plan, batch_size)
    if name in MODEL_PARALLEL:
        return (HybridStrategy if name == "hybrid" else TensorParallelStrategy)(ctx, precision, parallel, plan)
    return {"single": SingleStrategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy}[name](ctx, precision)
