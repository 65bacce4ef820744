"""The training loop: one ``Trainer`` that runs the same on 1 process or N (single | DDP | FSDP | TP | PP).

Batches come from a ``training.batches`` source as whole optimizer steps; the position is a global
sample cursor and the LR a function of samples consumed, so a checkpoint resumes on another world
size or strategy. Control flow (preemption, early stopping) is agreed by all-reduce. A run resumed on
the same layout ends, in deterministic mode, with bitwise-identical weights.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.config import EARLY_STOPPING_METRICS, PipelineConfig
from core.errors import TrainflowError
from training import faults
from training.batches import BatchPlan, StepBatches, build_source, choose_plan, scaled_lr  # noqa: F401
from training.checkpoint import (CheckpointManager, CheckpointMismatchError, TrainState, check_identity, model_copy,
                                 restore_model)
from tasks import get_task
from tasks.splits import Splits
from training.distributed import DistContext, all_gather_object, all_gather_tensor, all_reduce_sum, any_rank
from training.goodput import Ledger, agree_interval, describe, restart_count, summarise  # noqa: F401
from training.metrics import (StepMetrics, flops_per_sample, gpu_utilization, mfu, peak_memory_bytes,
                              state_bytes)
from training.preemption import StopRequest
from training.sink import MetricsSink
from training.parallel import build_strategy

log = logging.getLogger("trainflow.train")


def lr_factor(done: float, step_samples: int, warmup: float, total: float) -> float:
    """LR multiplier of the step that consumes samples [done, done + step_samples) of a run of
    ``total``: linear warm-up over the first ``warmup`` samples, then cosine decay to 0 (in samples,
    so a resume with another global batch continues the same curve)."""
    if warmup and done < warmup:
        return min(1.0, (done + step_samples) / warmup)
    span = max(1.0, total - warmup)
    progress = min(1.0, (done - warmup) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def state_dict_sha256(state: dict) -> str:
    """sha256 over a state dict (sorted keys, raw tensor bytes): equal weights, equal hash."""
    h = hashlib.sha256()
    for key, t in sorted(state.items()):
        h.update(key.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def followed_value(stats: EpochStats, metric: str) -> float:
    """The value of ``training.early_stopping.metric`` in an epoch's stats."""
    if metric == "val_loss":
        return stats.val_loss
    if metric == "val_accuracy":
        return stats.val_accuracy
    return stats.val_scores.get(metric[4:], float("nan"))


def lower_is_better(value: float, metric: str) -> float:
    """``value`` turned so that lower is better (a metric that improves upwards, negated)."""
    return -value if EARLY_STOPPING_METRICS[metric] else value


def improved(value: float, best: float | None, min_delta: float, metric: str = "val_loss") -> bool:
    """Whether an epoch's ``value`` of ``metric`` beats ``best`` (``lower_is_better`` form, None: no
    epoch yet) by more than ``min_delta``; a NaN (e.g. a ROC AUC of one class) never does."""
    if value is None or math.isnan(value):
        return False
    return best is None or lower_is_better(value, metric) < best - min_delta


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
    # The task's ``val_scores`` ({name: value}), when early stopping follows one of them.
    val_scores: dict = field(default_factory=dict)


@dataclass
class FitResult:
    status: str = "completed"  # completed | preempted
    history: list[EpochStats] = field(default_factory=list)
    resumed_from_step: int | None = None
    resized_from: dict | None = None  # the checkpoint writer's layout and plan, when it differs from this run's
    batch_policy: dict = field(default_factory=dict)  # training.batches.BatchChoice.record()
    stopped_early_at_epoch: int | None = None
    # With early stopping on, the epoch whose weights the run ends with: {"epoch", "of" (epochs run),
    # "metric", "best_epoch", "best_value", "restored"}; None: the last epoch's, early stopping off.
    kept_epoch: dict | None = None
    global_batch: int = 0
    effective_lr: float = 0.0
    train_wall_s: float = 0.0
    checkpoint_stall_s: float = 0.0
    last_metrics: dict = field(default_factory=dict)
    ranks: list[dict] = field(default_factory=list)
    goodput: dict = field(default_factory=dict)  # rank 0: training.goodput.summarise of the ledger
    checkpoint_interval: dict = field(default_factory=dict)  # this attempt's choose_interval answer


class ZeroStepsError(TrainflowError):
    """The train split gives no optimizer step: a run of it would train nothing and say completed."""

    @staticmethod
    def message(rows: int, ranks: int, batch: int) -> str:
        return (f"an epoch has zero steps: {rows} train rows, {rows / ranks:g} per rank on {ranks} rank(s), for a "
                f"batch of {batch} per rank; the train split is empty (look at the data's size, "
                "dataset.test_fraction, dataset.val_fraction and the label: a class of one row goes whole to a "
                "held-out split)")


# Module names wrappers put into a model's parameter names (DDP's ``module``, torch.compile's
# ``_orig_mod``); FSDP2's ``fully_shard`` keeps the names.
_WRAPPERS = frozenset({"module", "_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})


def plain_name(name: str) -> str:
    """A wrapped model's parameter name as the task's model names it."""
    return ".".join(part for part in name.split(".") if part not in _WRAPPERS)


@dataclass(frozen=True)
class GroupRule:
    """How ``train_step`` treats one of the optimizer's param groups (kept beside the optimizer, not in
    its groups: the rule is the config's, whatever a checkpoint's optimizer state holds)."""

    lr_scale: float = 1.0
    frozen_epochs: int = 0


def optimizer_groups(model: torch.nn.Module, groups) -> tuple[list[dict], list[GroupRule]]:
    """The optimizer's param groups and their rules: the task's (``tasks.base.ParamGroup``, matched by
    name through the wrappers), then the rest at the run's LR; an empty group is left out."""
    found: list[list] = [[] for _ in range(len(groups) + 1)]
    for name, p in model.named_parameters():
        plain = plain_name(name)
        found[next((i for i, g in enumerate(groups) if plain in g.names), len(groups))].append(p)
    rules = [GroupRule(g.lr_scale, g.frozen_epochs) for g in groups] + [GroupRule()]
    kept = [i for i, params in enumerate(found) if params]
    return [{"params": found[i]} for i in kept], [rules[i] for i in kept]


class Trainer:
    """Builds model/optimizer/batch source from the config and runs epochs of ``train_step``."""

    def __init__(self, cfg: PipelineConfig, ctx: DistContext, data: Splits, out_dir: Path,
                 sink: MetricsSink, config_id: str, data_md5: str, force_resume: bool = False):
        self.cfg, self.ctx, self.data, self.out = cfg, ctx, data, Path(out_dir)
        self.sink, self.config_id, self.data_md5, self.force_resume = sink, config_id, data_md5, force_resume
        t = cfg.training
        self.task = get_task(cfg.task)
        if t.class_weight == "balanced":  # the loss counts each class alike (tasks.base.Classifier)
            self.task = self.task.with_class_weights(_train_labels(data), len(data.info.classes))
        self.strategy = build_strategy(t.strategy, ctx, t.precision, t.parallel, self.task.parallel_plan(cfg),
                                       t.batch_size)
        self.strategy.task = self.task
        self.source = build_source(data.train, cfg.seed, t.loader)
        self.n_train = len(self.source)
        # The configured plan; a resume may change it (the batch policy).
        self._apply_plan(None)
        if self.plan.steps(self.n_train) == 0:  # epochs of nothing would report "completed"
            raise ZeroStepsError(ZeroStepsError.message(self.n_train, self.strategy.dp_size, self.plan.micro_batch))

        torch.manual_seed(cfg.seed)  # same initial weights on every rank
        built = self.task.build_model(cfg, data.info)
        groups = self.task.param_groups(cfg, built)
        self.model = self.strategy.wrap(self.task.to_device(cfg, built, ctx.device))
        opt, kw = (torch.optim.SGD, {"momentum": 0.9}) if t.optimizer == "sgd" else (torch.optim.AdamW, {})
        param_groups, self.group_rules = optimizer_groups(self.model, groups)
        self.opt = opt(param_groups, lr=self.lr, weight_decay=t.weight_decay, **kw)
        self.ckpt = CheckpointManager(self.out / "checkpoints", ctx, self.strategy, keep=t.keep_checkpoints,
                                      every_steps=t.checkpoint_every_steps, every_epochs=t.checkpoint_every_epochs,
                                      enabled=t.checkpoints, budget=t.checkpoint_budget)
        self.metrics = StepMetrics(ctx, t.straggler_ratio) if t.metrics else _NoMetrics()
        self.metrics.attach(self.model)  # DDP only
        if t.compile.enabled:  # after attach: its hooks go on the DDP module itself
            self.model = self.strategy.compile(self.model, t.compile.mode, t.compile.backend)
        self.fault, self.ids, self.stop = faults.from_env(), faults.id_recorder_from_env(), StopRequest()
        self.state = TrainState(model=self.model, optimizer=self.opt, config_id=config_id,
                                resume_id=cfg.resume_id(), data_md5=data_md5, layout=self.strategy.layout())
        # This rank's part of the current epoch's train loss (only ranks that report add to it).
        self.epoch_loss, self.epoch_n = 0.0, 0
        self.resized_from: dict | None = None
        self.last_metrics: dict = {}
        self.flops: float | None = None
        self.ledger = Ledger.for_rank(ctx.is_main, self.out)
        self.ledger.start(ctx.world_size)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def release(self) -> None:
        """Drop the wrapped model before the process group is destroyed: DDP's reducer holds the
        group, and left to interpreter shutdown gloo's threads can deadlock the exiting process."""
        import gc

        self.model = None
        self.state.model = self.state.optimizer = None
        self.strategy.release()
        gc.collect()

    def _apply_plan(self, writer: dict | None) -> None:
        """Choose the batch plan and LR given the checkpoint writer's plan (None: a fresh start)."""
        t = self.cfg.training
        choice = choose_plan(t.batch_size, t.grad_accum, self.strategy.dp_size, t.lr, t.base_batch, t.lr_scaling,
                             writer)
        self.choice, self.lr = choice, choice.lr
        self.plan = BatchPlan.of(choice.micro_batch, choice.grad_accum, self.strategy.dp_size, self.strategy.dp_rank)
        if t.strategy == "pp" and choice.micro_batch % t.parallel.microbatches:
            raise CheckpointMismatchError(
                f"the batch policy chose {choice.micro_batch} samples per rank, which "
                f"training.parallel.microbatches ({t.parallel.microbatches}) does not divide")

    def checkpoint_state(self) -> TrainState:
        """COLLECTIVE. The state to checkpoint now: every rank's RNG and epoch loss sums gathered."""
        st = self.state
        st.rng = all_gather_tensor(self.ctx, torch.get_rng_state())  # every rank's dropout stream
        sums = all_gather_tensor(self.ctx, torch.tensor([self.epoch_loss, float(self.epoch_n)], dtype=torch.float64))
        st.epoch_sums = [[float(s[0]), int(s[1])] for s in sums]
        st.plan = {**self.plan.describe(), "lr": self.lr,
                   "configured": [self.cfg.training.batch_size, self.cfg.training.grad_accum]}
        return st

    def resume(self) -> int | None:
        """Restore the latest valid checkpoint and choose the batch plan for this world; returns its
        step (None: a fresh start)."""
        loaded = self.ckpt.load_state(self.model, self.opt)
        if loaded is None:
            return None
        if not self.force_resume:  # the launcher checked the same before torchrun started
            check_identity(vars(loaded), self.config_id, self.data_md5, self.state.resume_id, where=str(self.ckpt.dir))
        self._apply_plan(loaded.plan)
        st = self.state
        for k in ("step", "epoch", "cursor", "best", "best_epoch", "best_model", "bad_epochs", "history"):
            setattr(st, k, getattr(loaded, k))
        if st.cursor > self.n_train:  # a forced resume onto other data: the epoch is over
            log.warning("checkpoint cursor %d is past this data's %d samples; the epoch ends here",
                        st.cursor, self.n_train)
            st.cursor = self.n_train
        rank, same_world = self.ctx.rank, len(loaded.epoch_sums) == self.ctx.world_size
        if same_world:
            self.epoch_loss, self.epoch_n = loaded.epoch_sums[rank][0], int(loaded.epoch_sums[rank][1])
        elif rank == 0:  # the partial epoch's sums, counted once (they are all-reduced at its end)
            self.epoch_loss = sum(s[0] for s in loaded.epoch_sums)
            self.epoch_n = int(sum(s[1] for s in loaded.epoch_sums))
        if rank < len(loaded.rng):
            torch.set_rng_state(loaded.rng[rank])
        resized = loaded.layout != self.strategy.layout() or self.choice.decision != "unchanged"
        self.resized_from = w = loaded.writer() if resized else None
        log.info("rank %d resumed from step %d (epoch %d, sample %d of %d)", rank, st.step, st.epoch + 1,
                 st.cursor, self.n_train)
        if resized and self.ctx.is_main:
            log.warning("resize: checkpoint written by %s worker(s) (strategy %s, dp %s, %s per rank x %s "
                        "micro-steps = global batch %s); this run: %d worker(s), strategy %s: %s",
                        w["world_size"], w["strategy"], w["dp_size"], w["micro_batch"], w["grad_accum"],
                        w["global_batch"], self.ctx.world_size, self.cfg.training.strategy, self.choice.reason)
        return st.step

    def train_step(self, batch: StepBatches) -> tuple[float, int]:
        """One optimizer step over this rank's micro-batches; returns their (summed per-sample loss, samples).
        Losses are scaled by dp_size / global_samples, so a short last step's mean is exact."""
        t, st = self.cfg.training, self.state
        scale = self.plan.dp_size / batch.global_samples
        loss_sum, rows = 0.0, 0
        last = len(batch.micro) - 1
        for k, (x, y) in enumerate(batch.micro):
            x, y = x.to(self.ctx.device), y.to(self.ctx.device)
            with self.strategy.sync_context(self.model, k == last):
                loss_sum += self.strategy.forward_backward(self.model, x, y, scale)
            rows += len(y)
        for group, rule in zip(self.opt.param_groups, self.group_rules):
            if st.epoch < rule.frozen_epochs:  # no gradient: the optimizer skips them, state and all
                for p in group["params"]:
                    p.grad = None
        if t.grad_clip:
            self.strategy.clip_grad_norm(self.model, t.grad_clip)
        factor = lr_factor(st.epoch * self.n_train + st.cursor, batch.global_samples,
                           t.warmup_epochs * self.n_train, t.epochs * self.n_train)
        for group, rule in zip(self.opt.param_groups, self.group_rules):
            group["lr"] = self.lr * factor * rule.lr_scale
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        st.step += 1
        st.cursor += batch.global_samples
        return loss_sum, rows

    def _evaluate(self) -> tuple[float, float, dict]:
        """(val loss, val accuracy per target, the task's val scores) over the val split, each data-parallel
        replica scoring a strided slice through the wrapped model (FSDP gathers shards in its forward; a
        pipeline stages), ``training.batch_size`` rows a forward: what a training step holds, gradients
        and all, so a large split (a language model's logits) fits too. Every replica runs as many
        forwards as the longest slice needs, a short one empty ones, since FSDP gathers in each. The
        scores, only when early stopping follows one: every replica's outputs are gathered to every
        rank, which all score the same arrays and so agree."""
        dp_rank, dp_size = self.strategy.dp_rank, self.strategy.dp_size
        x, y = (v[dp_rank::dp_size] for v in self.data.val.tensors)
        rows = self.cfg.training.batch_size
        longest = -(-len(self.data.val.tensors[0]) // dp_size)
        follows = self.cfg.training.early_stopping.metric[4:]
        outputs = [] if follows in self.task.val_score_names else None
        loss_sum, correct, n = 0.0, 0.0, 0
        self.model.eval()
        with torch.no_grad():
            for start in range(0, max(longest, 1), rows):
                part = [v[start:start + rows].to(self.ctx.device) for v in (x, y)]
                sums = self.strategy.eval_sums(self.model, *part, outputs)
                loss_sum, correct, n = loss_sum + sums[0], correct + sums[1], n + sums[2]
        self.model.train()
        w = 1.0 if self.strategy.reports else 0.0  # each replica's slice counts once
        loss_sum, correct, n = all_reduce_sum(self.ctx, [w * loss_sum, w * correct, w * n])
        scores = {}
        if outputs is not None:
            mine = (torch.cat(outputs).numpy(), y.cpu().numpy()) if self.strategy.reports and outputs else None
            parts = [p for p in all_gather_object(self.ctx, mine) if p is not None]
            if parts:
                import numpy as np

                scores = self.task.val_scores(np.concatenate([p[0] for p in parts]),
                                              np.concatenate([p[1] for p in parts]))
        return loss_sum / max(n, 1), self.task.val_accuracy(correct, n), scores

    def _early_stop(self, stats: EpochStats) -> bool:
        """Update patience from this epoch's (already all-reduced or gathered, so equal on every rank)
        metric, keep the best epoch's weights; agree to stop."""
        es, st = self.cfg.training.early_stopping, self.state
        if es.patience is None:
            return False
        value = followed_value(stats, es.metric)
        if improved(value, st.best, es.min_delta, es.metric):
            st.best, st.best_epoch, st.bad_epochs = lower_is_better(value, es.metric), stats.epoch, 0
            if es.restore_best:
                st.best_model = model_copy(self.strategy, self.model)
        else:
            st.bad_epochs += 1
        return any_rank(self.ctx, st.bad_epochs >= es.patience)

    def _keep_best(self, result: FitResult) -> None:
        """At the end of a completed run: load the best epoch's weights back when they are not the last's."""
        es, st = self.cfg.training.early_stopping, self.state
        if es.patience is None or st.best_epoch is None:
            return
        value = st.best if not EARLY_STOPPING_METRICS[es.metric] else -st.best
        restore = es.restore_best and st.best_model is not None and st.best_epoch != st.epoch
        if restore:
            restore_model(self.strategy, self.model, st.best_model)
        kept = st.best_epoch if es.restore_best else st.epoch
        result.kept_epoch = {"epoch": kept, "of": st.epoch, "metric": es.metric, "best_epoch": st.best_epoch,
                             "best_value": value, "restored": restore}
        if self.ctx.is_main:
            log.info("keeping epoch %d of %d (best %s %.6g at epoch %d)", kept, st.epoch, es.metric, value,
                     st.best_epoch)

    def _log_window(self) -> None:
        snap = self.metrics.snapshot()  # collective
        if snap is None:
            return
        values = {f"perf/{k}": v for k, v in snap.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        values["perf/straggler"] = float(bool(snap.get("straggler")))
        values.update(snap.get("per_rank") or {})  # rank/<r>/..., node/<n>/...: named as logged
        if self.flops is not None:
            values["perf/mfu"] = mfu(snap["samples_per_s"] / self.ctx.world_size, self.flops,
                                     self.cfg.training.peak_tflops * 1e12)
            if (util := gpu_utilization(self.ctx.device)) is not None:
                values["perf/gpu_util"] = util
        self.last_metrics = values
        self.sink.metrics(values, self.state.step)

    def _save_stall(self, stall: float | None) -> None:
        if stall is not None:
            self.metrics.add_checkpoint_stall(stall)
            self.ledger.checkpoint(self.state.step, stall)  # the measured checkpoint cost

    def _run_epoch(self) -> bool:
        """Train the rest of the current epoch from the cursor; True when preempted (checkpoint saved)."""
        t, st = self.cfg.training, self.state
        steps = self.source.epoch_steps(st.epoch, st.cursor, self.plan)
        while True:
            self.metrics.data_start()
            batch = next(steps, None)
            self.metrics.data_end()
            if batch is None:
                return False
            epoch, cursor = st.epoch, st.cursor
            loss_sum, rows = self.train_step(batch)
            counted = rows if self.strategy.reports else 0  # each sample counts once
            self.epoch_loss += loss_sum if counted else 0.0
            self.epoch_n += counted
            self.metrics.step_end(counted, self._tokens(batch) if counted else None)
            self.ledger.step(st.step)  # the heartbeat (an append at most every BEAT_S)
            if self.ids is not None and self.strategy.reports:
                self.ids.record(self.ctx.rank, epoch, st.step, cursor, batch.ids)
            if self.fault is not None and self.fault.due(st.step, self.ctx.rank):
                self.fault.fire(self.ctx.rank)
            if st.step % t.log_every_steps == 0:
                self._log_window()
            # Agreement is an all-reduce: not every step.
            preempt = st.step % t.preempt_check_steps == 0 and any_rank(self.ctx, self.stop.requested)
            self._save_stall(self.ckpt.maybe_save(st.step, self.checkpoint_state, force=preempt))
            if preempt:
                log.warning("rank %d: preempted at step %d; checkpoint saved", self.ctx.rank, st.step)
                return True

    def _tokens(self, batch: StepBatches):
        """The step's tokens, where the task's inputs are tokens (``Task.batch_tokens``); else None."""
        counts = [self.task.batch_tokens(x) for x, _ in batch.micro]
        return None if not counts or counts[0] is None else sum(counts)

    def _end_epoch(self, result: FitResult, t0: float) -> bool:
        """Validate, record the epoch, agree on early stopping, maybe checkpoint; True: stop."""
        t, st = self.cfg.training, self.state
        epoch_time = time.perf_counter() - t0
        loss_sum, n_seen = all_reduce_sum(self.ctx, [self.epoch_loss, self.epoch_n])
        val_loss, val_acc, scores = self._evaluate()
        lr = self.opt.param_groups[0]["lr"] / self.group_rules[0].lr_scale  # the run's, not a scaled group's
        stats = EpochStats(st.epoch + 1, loss_sum / max(n_seen, 1), val_loss, val_acc,
                           n_seen / epoch_time, epoch_time, lr, scores)
        st.history.append(asdict(stats))
        self.sink.epoch(stats, st.step)
        stop = self._early_stop(stats)
        st.epoch, st.cursor, self.epoch_loss, self.epoch_n = st.epoch + 1, 0, 0.0, 0
        if stop:
            result.stopped_early_at_epoch = st.epoch
            log.info("early stop agreed by all ranks after epoch %d", st.epoch)
        self._save_stall(self.ckpt.maybe_save(st.step, self.checkpoint_state, epoch_done=st.epoch,
                                              force=stop or st.epoch == t.epochs))
        return stop

    def fit(self) -> FitResult:
        t = self.cfg.training
        result = FitResult(resumed_from_step=self.resume())
        self.ledger.resumed(result.resumed_from_step)
        result.checkpoint_interval = agree_interval(self.ctx, self.ledger, t.checkpoint_every, t.checkpoint_every_steps)
        self.ckpt.every_steps = result.checkpoint_interval["steps"]
        result.global_batch, result.effective_lr = self.plan.global_batch, self.lr
        result.resized_from, result.batch_policy = self.resized_from, self.choice.record()
        # MFU needs one rank to run the whole model on a batch: not a pipeline stage.
        if self.ctx.device.type == "cuda" and t.peak_tflops and t.strategy != "pp":
            x0, y0 = (v[:self.plan.micro_batch].to(self.ctx.device) for v in self.data.train.tensors[:2])
            self.flops = flops_per_sample(self.strategy.unwrapped(self.model), x0, lambda out: self.task.loss(out, y0))
        params = {"global_batch": self.plan.global_batch, "effective_lr": self.lr, "world_size": self.ctx.world_size,
                  "steps_per_epoch": self.plan.steps(self.n_train), "backend": self.ctx.backend or "none",
                  "strategy": t.strategy, "precision": t.precision}
        if self.resized_from is not None:
            # One MLflow run spans the restarts and MLflow refuses a param a new value: own names.
            params = {f"resized_at_step_{result.resumed_from_step}.{k}": v for k, v in params.items()}
        self.sink.params(params)
        self.sink.start(total_epochs=t.epochs, done=self.state.epoch)
        wall0 = time.perf_counter()
        self.model.train()
        while self.state.epoch < t.epochs:
            t0 = time.perf_counter()
            if self._run_epoch():
                result.status = "preempted"
                break
            if self._end_epoch(result, t0):
                break
        if result.status == "completed":
            self._keep_best(result)
        return self._finish(result, wall0)

    def _finish(self, result: FitResult, wall0: float) -> FitResult:
        self.ckpt.wait()  # the last checkpoint is on disk before anyone reports success
        result.train_wall_s = time.perf_counter() - wall0
        self.ledger.finish(result.status, self.state.step)
        if self.ledger.enabled:
            result.goodput = summarise(self.ledger.events())
            log.info("%s", describe(result.goodput))
        result.history = [EpochStats(**h) for h in self.state.history]
        result.checkpoint_stall_s = self.ckpt.stall_s
        result.last_metrics = dict(self.last_metrics)
        st = self.state
        mine = {"rank": self.ctx.rank, "epochs_run": st.epoch, "step": st.step,
                "stopped_early_at_epoch": result.stopped_early_at_epoch, "status": result.status,
                "peak_mem_mb": peak_memory_bytes(self.ctx.device) / 2**20,
                **state_bytes(self.model, self.opt), **self.strategy.rank_info()}
        result.ranks = all_gather_object(self.ctx, mine)
        self.sink.finish()
        return result


def _train_labels(data: Splits):
    """The train split's class indices; a streamed train split's held-out rows stand in (a stratified
    sample of it, so the same class shares)."""
    tensors = getattr(data.train, "tensors", None)
    return (tensors[1] if tensors is not None else data.val.tensors[1]).numpy()
