"""The training loop: one ``Trainer`` that runs the same on 1 process or N (single | DDP | FSDP).

Global batch = per-worker batch x world size x grad_accum; the learning rate is
scaled to it by ``training.lr_scaling``, warmed up linearly, then follows a
cosine decay. Uneven shards are padded by ``DistributedSampler`` (it repeats a
few samples so every rank runs the same number of steps; no rank waits on a
collective the others never reach).

Everything that decides control flow (preemption, early stopping) is agreed by
an all-reduce, so all ranks take the same branch at the same step. Checkpoints
hold the position inside the epoch, so a resumed run repeats and skips nothing
and, in deterministic mode, ends with bitwise-identical weights.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

from core.config import PipelineConfig
from training import faults
from training.checkpoint import CheckpointManager, CheckpointMismatchError
from training.data import Splits
from training.distributed import DistContext, all_gather_object, all_gather_tensor, all_reduce_sum, any_rank
from training.goodput import Ledger, agree_interval, describe, summarise
from training.metrics import StepMetrics, flops_per_sample, gpu_utilization, mfu, peak_memory_bytes
from training.models import build_model
from training.preemption import StopRequest
from training.sink import MetricsSink
from training.strategies import build_strategy

log = logging.getLogger("trainflow.train")


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


def state_dict_sha256(state: dict) -> str:
    """sha256 over a state dict (sorted keys, raw tensor bytes): equal weights, equal hash."""
    h = hashlib.sha256()
    for key, t in sorted(state.items()):
        h.update(key.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class _NoMetrics:
    """Stands in for StepMetrics when ``training.metrics`` is off: every call is a no-op."""

    def __getattr__(self, name):
        return lambda *a, **k: None


@dataclass
class EpochStats:
    epoch: int
    train_loss: float
    val_loss: float
    val_accuracy: float | None  # None for a task without accuracy (regression)
    samples_per_s: float
    epoch_time_s: float
    lr: float


@dataclass
class FitResult:
    status: str = "completed"  # completed | preempted
    history: list[EpochStats] = field(default_factory=list)
    resumed_from_step: int | None = None
    stopped_early_at_epoch: int | None = None
    global_batch: int = 0
    effective_lr: float = 0.0
    train_wall_s: float = 0.0
    checkpoint_stall_s: float = 0.0
    last_metrics: dict = field(default_factory=dict)
    ranks: list[dict] = field(default_factory=list)
    goodput: dict = field(default_factory=dict)  # rank 0: training.goodput.summarise of the ledger
    checkpoint_interval: dict = field(default_factory=dict)  # this attempt's choose_interval answer


class Trainer:
    """Builds model/optimizer/schedule from the config and runs epochs with checkpoints."""

    def __init__(self, cfg: PipelineConfig, ctx: DistContext, data: Splits, out_dir: Path,
                 sink: MetricsSink, config_id: str, data_md5: str, force_resume: bool = False):
        self.cfg, self.ctx, self.data, self.out = cfg, ctx, data, Path(out_dir)
        self.sink, self.config_id, self.data_md5 = sink, config_id, data_md5
        self.force_resume = force_resume
        t = cfg.training
        from tasks import get_task

        self.task = get_task(cfg.task)
        self.strategy = build_strategy(t.strategy, ctx, t.precision, t.parallel, cfg.model, t.batch_size)
        self.strategy.task = self.task
        # Data-parallel replicas: ranks of one tensor-parallel group or pipeline share batches.
        self.global_batch = t.batch_size * self.strategy.dp_size * t.grad_accum
        self.lr = scaled_lr(t.lr, self.global_batch, t.base_batch, t.lr_scaling)

        torch.manual_seed(cfg.seed)  # same initial weights on every rank
        self.model = self.strategy.wrap(build_model(cfg, data.info).to(ctx.device))
        params = self.model.parameters()
        if t.optimizer == "sgd":
            self.opt = torch.optim.SGD(params, lr=self.lr, momentum=0.9, weight_decay=t.weight_decay)
        else:
            self.opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=t.weight_decay)
        self.sampler = DistributedSampler(
            data.train, num_replicas=self.strategy.dp_size, rank=self.strategy.dp_rank, shuffle=True, seed=cfg.seed
        )
        self.micro_per_epoch = math.ceil(len(self.sampler) / t.batch_size)
        self.steps_per_epoch = max(1, self.micro_per_epoch // t.grad_accum)
        total = self.steps_per_epoch * t.epochs
        warmup = int(t.warmup_epochs * self.steps_per_epoch)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(warmup, total))
        self.ckpt = CheckpointManager(self.out / "checkpoints", ctx, self.strategy, keep=t.keep_checkpoints)
        self.metrics = StepMetrics(ctx, t.straggler_ratio) if t.metrics else _NoMetrics()
        if t.metrics and t.strategy == "ddp" and ctx.distributed:
            self.metrics.attach_comm_hook(self.model)
        self.fault = faults.from_env()
        self.stop = StopRequest()
        # Position: the next epoch to run and how many micro-batches of it are done.
        self.step, self.epoch, self.pos = 0, 0, 0
        self.epoch_loss, self.epoch_n = 0.0, 0
        self.best, self.bad_epochs = None, 0
        self.history: list[EpochStats] = []
        self.stall_total = 0.0
        # goodput (h13d): rank 0's ledger; this attempt's mid-epoch checkpoint interval is chosen in fit().
        self.ledger = Ledger.for_rank(ctx.is_main, self.out)
        self.ledger.start(ctx.world_size)
        self.every_steps = t.checkpoint_every_steps

    @property
    def raw_model(self) -> torch.nn.Module:
        return self.strategy.unwrapped(self.model)

    def release(self) -> None:
        """Drop the wrapped model before the process group is destroyed.

        DDP's reducer holds the group; left to interpreter shutdown, gloo's threads
        were seen to deadlock the exiting process after training had finished.
        """
        import gc

        self.model = None
        self.strategy.release()
        gc.collect()

    # -- checkpoint state ---------------------------------------------------------------
    def _extra(self) -> dict:
        return {
            "scheduler": self.sched.state_dict(),
            "step": self.step, "epoch": self.epoch, "pos": self.pos,
            "epoch_loss": self.epoch_loss, "epoch_n": self.epoch_n,
            "best": self.best, "bad_epochs": self.bad_epochs,
            "history": [asdict(h) for h in self.history],
            "rng": all_gather_tensor(self.ctx, torch.get_rng_state()),  # every rank's dropout stream
            "world_size": self.ctx.world_size,
            "layout": self.strategy.layout(),
            "config_id": self.config_id,
            "data_md5": self.data_md5,
        }

    def save(self) -> float:
        """Checkpoint the current position (collective); returns the stall in seconds."""
        if not self.cfg.training.checkpoints:
            return 0.0
        t0 = time.perf_counter()
        self.ckpt.save(self.step, self.model, self.opt, self._extra())
        stall = time.perf_counter() - t0
        self.metrics.add_checkpoint_stall(stall)
        self.stall_total += stall
        self.ledger.checkpoint(self.step, stall)  # goodput (h13d): the measured checkpoint cost
        return stall

    def resume(self) -> int | None:
        """Restore the latest valid checkpoint, if any; returns its step."""
        if not self.cfg.training.checkpoints:
            return None
        extra = self.ckpt.load_latest(self.model, self.opt)
        if extra is None:
            return None
        for key, mine in (("config_id", self.config_id), ("data_md5", self.data_md5)):
            if extra.get(key) != mine and not self.force_resume:
                raise CheckpointMismatchError(
                    f"checkpoint in {self.ckpt.dir} was written for {key}={extra.get(key)}, this run has "
                    f"{mine}; use a fresh --out, or --force-resume to continue from it anyway"
                )
        self.sched.load_state_dict(extra["scheduler"])
        self.step, self.epoch, self.pos = extra["step"], extra["epoch"], extra["pos"]
        self.epoch_loss, self.epoch_n = extra["epoch_loss"], extra["epoch_n"]
        self.best, self.bad_epochs = extra["best"], extra["bad_epochs"]
        self.history = [EpochStats(**h) for h in extra["history"]]
        if extra.get("world_size") == self.ctx.world_size:
            torch.set_rng_state(extra["rng"][self.ctx.rank])
        log.info("rank %d resumed from step %d (epoch %d, batch %d)", self.ctx.rank, self.step,
                 self.epoch + 1, self.pos)
        return self.step

    # -- loop ---------------------------------------------------------------------------
    def _batches(self, epoch: int, skip_batches: int):
        """This rank's batches of ``epoch``, from batch ``skip_batches`` on (resume mid-epoch).

        The same batches a ``DataLoader(sampler=DistributedSampler, batch_size=B)``
        yields, cut straight from the in-memory tensors: one index op per batch
        instead of B row fetches and a collate (that was ~5 % of step time here).
        Nothing here draws from the global RNG, so dropout masks are unaffected.
        """
        self.sampler.set_epoch(epoch)
        b = self.cfg.training.batch_size
        if self.cfg.training.loader.kind == "dataloader":
            yield from self._dataloader(epoch, skip_batches)
            return
        order = torch.tensor(list(self.sampler), dtype=torch.long)[skip_batches * b:]
        tensors = self.data.train.tensors
        for start in range(0, len(order), b):
            idx = order[start:start + b]
            yield tuple(t[idx] for t in tensors)

    def _dataloader(self, epoch: int, skip_batches: int):
        """The same batches through a torch DataLoader (workers, pinned memory, prefetch)."""
        from torch.utils.data import DataLoader

        lc, b = self.cfg.training.loader, self.cfg.training.batch_size
        indices = list(self.sampler)[skip_batches * b:]
        # Own generator: a loader must not draw its seed from the global RNG (dropout's),
        # or a resumed run would diverge from an uninterrupted one.
        gen = torch.Generator().manual_seed(self.cfg.seed + epoch)
        extra = {"prefetch_factor": lc.prefetch_factor} if lc.prefetch_factor else {}
        yield from DataLoader(self.data.train, batch_size=b, sampler=indices, generator=gen,
                              num_workers=lc.num_workers, pin_memory=lc.pin_memory, **extra)

    def _evaluate(self) -> tuple[float, float]:
        """(val loss, val accuracy) over the whole val split (accuracy per target: per token for
        the LM), each data-parallel replica scoring a strided slice.

        Runs the wrapped model (FSDP needs its own forward to gather shards; a pipeline its stages).
        """
        x, y = self.data.val.tensors
        dp_rank, dp_size = self.strategy.dp_rank, self.strategy.dp_size
        x = x[dp_rank::dp_size].to(self.ctx.device)
        y = y[dp_rank::dp_size].to(self.ctx.device)
        self.model.eval()
        with torch.no_grad():
            loss_sum, correct, n = self.strategy.eval_sums(self.model, x, y)
        self.model.train()
        w = 1.0 if self.strategy.reports else 0.0  # each replica's slice counts once
        loss_sum, correct, n = all_reduce_sum(self.ctx, [w * loss_sum, w * correct, w * n])
        return loss_sum / max(n, 1), (correct / max(n, 1) if self.task.has_accuracy else None)

    def _early_stop(self, stats: EpochStats) -> bool:
        """Update patience from this epoch's (already all-reduced) metric; agree to stop."""
        es = self.cfg.training.early_stopping
        if es.patience is None:
            return False
        value = stats.val_loss if es.metric == "val_loss" else -stats.val_accuracy
        if self.best is None or value < self.best - es.min_delta:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        return any_rank(self.ctx, self.bad_epochs >= es.patience)

    def _log_window(self) -> None:
        snap = self.metrics.snapshot()  # collective
        if snap is None:
            return
        values = {f"perf/{k}": v for k, v in snap.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        values["perf/straggler"] = float(bool(snap.get("straggler")))
        if self.flops is not None:
            values["perf/mfu"] = mfu(snap["samples_per_s"] / self.ctx.world_size, self.flops,
                                     self.cfg.training.peak_tflops * 1e12)
            util = gpu_utilization(self.ctx.device)
            if util is not None:
                values["perf/gpu_util"] = util
        self.last_metrics = values
        self.sink.metrics(values, self.step)

    def _train_step(self, x, y, boundary: bool) -> float:
        t = self.cfg.training
        with self.strategy.sync_context(self.model, boundary):
            loss = self.strategy.forward_backward(self.model, x, y, t.grad_accum)
        if boundary:
            if t.grad_clip:
                self.strategy.clip_grad_norm(self.model, t.grad_clip)
            self.opt.step()
            self.sched.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
        return loss

    def fit(self) -> FitResult:
        t = self.cfg.training
        result = FitResult(global_batch=self.global_batch, effective_lr=self.lr)
        result.resumed_from_step = self.resume()
        # goodput (h13d): what this attempt resumed, and the interval it checkpoints at.
        self.ledger.resumed(result.resumed_from_step)
        result.checkpoint_interval = agree_interval(self.ctx, self.ledger, t.checkpoint_every, t.checkpoint_every_steps)
        self.every_steps = result.checkpoint_interval["steps"]
        self.last_metrics: dict = {}
        self.flops = None
        # MFU needs one rank to run the whole model on a batch: not a pipeline stage.
        if self.ctx.device.type == "cuda" and t.peak_tflops and t.strategy != "pp":
            x0, y0 = self.data.train.tensors[0][: t.batch_size], self.data.train.tensors[1][: t.batch_size]
            self.flops = flops_per_sample(self.raw_model, x0.to(self.ctx.device),
                                          lambda out: self.task.loss(out, y0.to(self.ctx.device)))
        self.sink.params({
            "global_batch": self.global_batch, "effective_lr": self.lr, "world_size": self.ctx.world_size,
            "steps_per_epoch": self.steps_per_epoch, "backend": self.ctx.backend or "none",
            "strategy": t.strategy, "precision": t.precision,
        })
        self.sink.start(total_epochs=t.epochs, done=self.epoch)
        wall0 = time.perf_counter()
        self.model.train()
        while self.epoch < t.epochs:
            t0 = time.perf_counter()
            it = self._batches(self.epoch, self.pos)
            while True:
                self.metrics.data_start()
                batch = next(it, None)
                self.metrics.data_end()
                if batch is None:
                    break
                x, y = batch[0].to(self.ctx.device), batch[1].to(self.ctx.device)
                boundary = (self.pos + 1) % t.grad_accum == 0
                loss = self._train_step(x, y, boundary)
                self.pos += 1
                n_counted = len(y) if self.strategy.reports else 0  # each batch counts once
                self.epoch_loss += loss * n_counted
                self.epoch_n += n_counted
                if not boundary:
                    continue
                self.metrics.step_end(n_counted * t.grad_accum)
                self.ledger.step(self.step)  # goodput (h13d): the heartbeat (an append at most every BEAT_S)
                if self.fault is not None and self.fault.due(self.step, self.ctx.rank):
                    self.fault.fire(self.ctx.rank)
                if self.step % t.log_every_steps == 0:
                    self._log_window()
                # Agreement is an all-reduce: every step it cost ~2 % of a small model's step.
                preempt = self.step % t.preempt_check_steps == 0 and any_rank(self.ctx, self.stop.requested)
                if preempt or (self.every_steps and self.step % self.every_steps == 0):
                    self.save()
                if preempt:
                    log.warning("rank %d: preempted at step %d; checkpoint saved", self.ctx.rank, self.step)
                    result.status = "preempted"
                    return self._finish(result, wall0)
            # A tail of micro-batches smaller than grad_accum is dropped, not stepped.
            self.opt.zero_grad(set_to_none=True)
            epoch_time = time.perf_counter() - t0
            loss_sum, n_seen = all_reduce_sum(self.ctx, [self.epoch_loss, self.epoch_n])
            val_loss, val_acc = self._evaluate()
            stats = EpochStats(self.epoch + 1, loss_sum / max(n_seen, 1), val_loss, val_acc,
                               n_seen / epoch_time, epoch_time, self.sched.get_last_lr()[0])
            self.history.append(stats)
            self.sink.epoch(stats, self.step)
            stop = self._early_stop(stats)
            self.epoch, self.pos, self.epoch_loss, self.epoch_n = self.epoch + 1, 0, 0.0, 0
            if stop:
                result.stopped_early_at_epoch = self.epoch
                log.info("early stop agreed by all ranks after epoch %d", self.epoch)
            if stop or self.epoch % t.checkpoint_every_epochs == 0 or self.epoch == t.epochs:
                self.save()
            if stop:
                break
        return self._finish(result, wall0)

    def _finish(self, result: FitResult, wall0: float) -> FitResult:
        self.ckpt.wait()  # the last checkpoint is on disk before anyone reports success
        result.train_wall_s = time.perf_counter() - wall0
        # goodput (h13d): this attempt ended on its own; rank 0 sums up the training's ledger.
        self.ledger.finish(result.status, self.step)
        if self.ledger.enabled:
            result.goodput = summarise(self.ledger.events())
            log.info("%s", describe(result.goodput))
        result.history = list(self.history)
        result.checkpoint_stall_s = self.stall_total
        result.last_metrics = dict(self.last_metrics)
        mine = {"rank": self.ctx.rank, "epochs_run": self.epoch, "step": self.step,
                "stopped_early_at_epoch": result.stopped_early_at_epoch, "status": result.status,
                "peak_mem_mb": peak_memory_bytes(self.ctx.device) / 2**20,
                **self.strategy.state_bytes(self.model, self.opt), **self.strategy.rank_info()}
        result.ranks = all_gather_object(self.ctx, mine)
        self.sink.finish()
        return result


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 on a first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
