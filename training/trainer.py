"""The training loop: one ``Trainer`` that runs the same on 1 process or N (DDP).

Global batch = per-worker batch x world size x grad_accum; the learning rate is
scaled to it by ``training.lr_scaling`` and warmed up linearly, then follows a
cosine decay. Uneven shards are padded by ``DistributedSampler`` (it repeats a
few samples so every rank runs the same number of steps; no rank waits on a
collective the others never reach).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from core.config import PipelineConfig
from training.checkpoint import CheckpointManager, CheckpointMismatchError
from training.data import Splits
from training.distributed import DistContext, all_gather_object, all_reduce_sum
from training.models import build_model
from training.sink import MetricsSink

log = logging.getLogger(__name__)


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """The LR for ``global_batch`` given one tuned for ``base_batch`` (linear or sqrt rule)."""
    ratio = global_batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    return base_lr


def lr_lambda(warmup_steps: int, total_steps: int):
    """Multiplier per optimizer step: linear warm-up to 1, then cosine decay to 0."""

    def f(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the state dict (sorted keys, raw tensor bytes): equal weights, equal hash."""
    h = hashlib.sha256()
    for key, t in sorted(model.state_dict().items()):
        h.update(key.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class EpochStats:
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float
    samples_per_s: float
    epoch_time_s: float
    lr: float


@dataclass
class FitResult:
    history: list[EpochStats] = field(default_factory=list)
    resumed_from_step: int | None = None
    global_batch: int = 0
    effective_lr: float = 0.0
    train_wall_s: float = 0.0


class Trainer:
    """Builds model/optimizer/schedule from the config and runs epochs with checkpoints."""

    def __init__(self, cfg: PipelineConfig, ctx: DistContext, data: Splits, out_dir: Path,
                 sink: MetricsSink, config_id: str, data_md5: str):
        self.cfg, self.ctx, self.data, self.out = cfg, ctx, data, Path(out_dir)
        self.sink, self.config_id, self.data_md5 = sink, config_id, data_md5
        t = cfg.training
        self.global_batch = t.batch_size * ctx.world_size * t.grad_accum
        self.lr = scaled_lr(t.lr, self.global_batch, t.base_batch, t.lr_scaling)

        torch.manual_seed(cfg.seed)  # same initial weights on every rank
        model = build_model(cfg.model, cfg.dataset).to(ctx.device)
        self.model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None) \
            if ctx.distributed else model
        self.raw_model = model
        params = self.model.parameters()
        if t.optimizer == "sgd":
            self.opt = torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=t.weight_decay)
        else:
            self.opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=t.weight_decay)
        self.sampler = DistributedSampler(
            data.train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed
        )
        micro_per_epoch = math.ceil(len(self.sampler) / t.batch_size)
        self.steps_per_epoch = max(1, micro_per_epoch // t.grad_accum)
        total = self.steps_per_epoch * t.epochs
        warmup = int(t.warmup_epochs * self.steps_per_epoch)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(warmup, total))
        self.ckpt = CheckpointManager(self.out / "checkpoints", is_writer=ctx.is_main)
        self.step = 0
        self.start_epoch = 0

    def release(self) -> None:
        """Drop the DDP wrapper before the process group is destroyed.

        Its reducer holds the group; left to interpreter shutdown, gloo's threads
        were seen to deadlock the exiting process after training had finished.
        """
        import gc

        self.model = self.raw_model
        gc.collect()

    # -- checkpoint state ---------------------------------------------------------------
    def _state(self, epoch_done: int) -> dict:
        rng = all_gather_object(self.ctx, torch.get_rng_state())  # every rank's dropout stream
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "epoch": epoch_done,
            "step": self.step,
            "rng": rng,
            "world_size": self.ctx.world_size,
            "config_id": self.config_id,
            "data_md5": self.data_md5,
        }

    def resume(self, force: bool = False) -> int | None:
        """Restore the latest valid checkpoint, if any; returns its step."""
        state = self.ckpt.load_latest()
        if state is None:
            return None
        for key, mine in (("config_id", self.config_id), ("data_md5", self.data_md5)):
            if state.get(key) != mine and not force:
                raise CheckpointMismatchError(
                    f"checkpoint in {self.ckpt.dir} was written for {key}={state.get(key)}, "
                    f"this run has {mine}; use a fresh --out or force the resume"
                )
        self.raw_model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        self.step, self.start_epoch = state["step"], state["epoch"]
        if state.get("world_size") == self.ctx.world_size:
            torch.set_rng_state(state["rng"][self.ctx.rank])
        return self.step

    # -- loop ---------------------------------------------------------------------------
    def _loader(self, epoch: int) -> DataLoader:
        self.sampler.set_epoch(epoch)
        # Own generator: a loader must not draw its seed from the global RNG (dropout's),
        # or a resumed run would diverge from an uninterrupted one.
        gen = torch.Generator().manual_seed(self.cfg.seed + epoch)
        return DataLoader(self.data.train, batch_size=self.cfg.training.batch_size,
                          sampler=self.sampler, generator=gen)

    def _evaluate(self) -> tuple[float, float]:
        """(val loss, val accuracy) over the whole val split, each rank scoring a strided slice."""
        x, y = self.data.val.tensors
        x = x[self.ctx.rank::self.ctx.world_size].to(self.ctx.device)
        y = y[self.ctx.rank::self.ctx.world_size].to(self.ctx.device)
        self.raw_model.eval()
        with torch.no_grad():
            logits = self.raw_model(x) if len(x) else torch.zeros(0, self.cfg.dataset.n_classes)
            loss_sum = F.cross_entropy(logits, y, reduction="sum").item() if len(x) else 0.0
            correct = (logits.argmax(1) == y).sum().item()
        self.raw_model.train()
        loss_sum, correct, n = all_reduce_sum(self.ctx, [loss_sum, correct, len(y)])
        return loss_sum / max(n, 1), correct / max(n, 1)

    def fit(self) -> FitResult:
        t = self.cfg.training
        result = FitResult(global_batch=self.global_batch, effective_lr=self.lr)
        result.resumed_from_step = self.resume()
        self.sink.params({
            "global_batch": self.global_batch, "effective_lr": self.lr, "world_size": self.ctx.world_size,
            "steps_per_epoch": self.steps_per_epoch, "backend": self.ctx.backend or "none",
        })
        self.sink.start(total_epochs=t.epochs, done=self.start_epoch)
        wall0 = time.perf_counter()
        self.model.train()
        for epoch in range(self.start_epoch, t.epochs):
            t0 = time.perf_counter()
            loss_sum, n_seen = 0.0, 0
            for i, (x, y) in enumerate(self._loader(epoch)):
                x, y = x.to(self.ctx.device), y.to(self.ctx.device)
                boundary = (i + 1) % t.grad_accum == 0
                sync = nullcontext() if boundary or not self.ctx.distributed else self.model.no_sync()
                with sync:
                    loss = F.cross_entropy(self.model(x), y)
                    (loss / t.grad_accum).backward()
                loss_sum += loss.item() * len(y)
                n_seen += len(y)
                if boundary:
                    if t.grad_clip:
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.grad_clip)
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad(set_to_none=True)
                    self.step += 1
                    if self.step % t.log_every_steps == 0:
                        self.sink.metrics({"train/step_loss": loss.item()}, self.step)
            # A tail of micro-batches smaller than grad_accum is dropped, not stepped.
            self.opt.zero_grad(set_to_none=True)
            epoch_time = time.perf_counter() - t0
            loss_sum, n_seen = all_reduce_sum(self.ctx, [loss_sum, n_seen])
            val_loss, val_acc = self._evaluate()
            stats = EpochStats(epoch + 1, loss_sum / max(n_seen, 1), val_loss, val_acc,
                               n_seen / epoch_time, epoch_time, self.sched.get_last_lr()[0])
            result.history.append(stats)
            self.sink.epoch(stats, self.step)
            if (epoch + 1) % t.checkpoint_every_epochs == 0 or epoch + 1 == t.epochs:
                state = self._state(epoch + 1)
                self.ckpt.save(self.step, state)
                self.ckpt.prune(t.keep_checkpoints)
        result.train_wall_s = time.perf_counter() - wall0
        self.sink.finish()
        return result


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 on a first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
