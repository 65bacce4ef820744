"""Loop parity: trainflow's ``Trainer`` against a plain hand-written DDP loop.

    python benchmarks/parity.py --repeats 3          # hand, lean, default, hand, lean, default, ...

Every run is a real ``torchrun --standalone`` job (this file in ``--worker`` mode); rank 0 times the
training loop only (no start-up, imports, data or model build) and writes a JSON the parent reads.
``hand`` (``_hand``) does the Trainer's work in the same numerical order (its seeds, sample order,
LR schedule, clipping, a validation pass per epoch), so equal final weights' sha256 means bit for
bit the same arithmetic. Modes and goals: BENCHMARKS.md; diagnostic modes: ``hand-agree`` (plus the
Trainer's per-step preemption all-reduce), ``lean-noagree`` (that agreement made local),
``hand-nodet`` (without deterministic algorithms). The last line is ``parity_ratio=<lean/hand>``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, parser

from core.paths import python_path_with

MODES = ("hand", "lean", "default")
DIAGNOSTIC = ("hand-agree", "hand-nodet", "lean-noagree")
LEAN = ["training.checkpoints=false", "training.metrics=false"]
LOSS_DECIMALS = 5
GOALS = {"lean": 0.98, "default": 0.95}


# -- worker side (one process of a torchrun job) ------------------------------------------
def _step_ms(stamps: list[tuple[int, float]]) -> float:
    """Median ms from one step's start to the next's within an epoch: shrugs off bursts of other load."""
    gaps = [(t1 - t0) * 1e3 for (e0, t0), (e1, t1) in zip(stamps, stamps[1:]) if e0 == e1]
    return statistics.median(gaps) if gaps else float("nan")


def _hand(args, cfg) -> dict:
    """The plain loop; returns rank 0's measurements."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from training.data import load_splits
    from tasks import get_task
    from training.trainer import lr_factor, scaled_lr, state_dict_sha256

    t = cfg.training
    if t.grad_accum != 1:
        raise SystemExit("parity: the hand-written loop has no gradient accumulation; use grad_accum: 1")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = load_splits(cfg, ROOT, cfg.seed)

    torch.manual_seed(cfg.seed)  # initial weights and the dropout stream start where the Trainer's do
    model = DDP(get_task(cfg.task).build_model(cfg, data.info))
    lr = scaled_lr(t.lr, t.batch_size * world, t.base_batch, t.lr_scaling)
    if t.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=t.weight_decay)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=t.weight_decay)
    b, n_all = t.batch_size, len(data.train)
    g_batch = b * world
    x_all, y_all = data.train.tensors
    xv, yv = (v[rank::world] for v in data.val.tensors)

    history, train_s, eval_s, samples, steps, step_t = [], [], [], 0, 0, []
    # No barrier: like the Trainer, the clock starts after DDP's construction broadcast and some
    # local set-up, and any skew left between the ranks is absorbed by the first step.
    cpu0, wall0 = time.process_time(), time.perf_counter()
    model.train()
    for epoch in range(t.epochs):
        t0 = time.perf_counter()
        # The Trainer's memory loader: a DataLoader would draw its seed from the global RNG,
        # shifting every dropout mask after it.
        order = torch.randperm(n_all, generator=torch.Generator().manual_seed(cfg.seed + epoch))
        loss_sum, n = 0.0, 0
        for start in range(0, n_all, g_batch):
            step_t.append((epoch, time.perf_counter()))
            total = min(g_batch, n_all - start)
            idx = order[start:start + total][rank * b:(rank + 1) * b]
            x, y = x_all[idx], y_all[idx]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x), y, reduction="sum")
            (loss * (world / total)).backward()
            if t.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            factor = lr_factor(epoch * n_all + start, total, t.warmup_epochs * n_all, t.epochs * n_all)
            for group in opt.param_groups:
                group["lr"] = lr * factor
            opt.step()
            steps += 1
            loss_sum += loss.item()
            n += len(y)
            if args.worker == "hand-agree":  # the Trainer's per-step preemption agreement
                flag = torch.tensor([0.0], dtype=torch.float64)
                dist.all_reduce(flag)
                _ = flag.tolist()[0] > 0
        train_s.append(time.perf_counter() - t0)
        tot = torch.tensor([loss_sum, n], dtype=torch.float64)
        dist.all_reduce(tot)
        t1 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            logits = model(xv)
            vsum = F.cross_entropy(logits, yv, reduction="sum").item()
            correct = (logits.argmax(1) == yv).sum().item()
        model.train()
        vt = torch.tensor([vsum, correct, len(yv)], dtype=torch.float64)
        dist.all_reduce(vt)
        eval_s.append(time.perf_counter() - t1)
        loss_sum, n = tot.tolist()
        samples += int(n)
        history.append({"train_loss": loss_sum / n, "val_loss": vt[0].item() / vt[2].item(),
                        "val_accuracy": vt[1].item() / vt[2].item()})
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    cpu_all = torch.tensor([cpu], dtype=torch.float64)
    dist.all_reduce(cpu_all)
    sha = state_dict_sha256(model.module.state_dict())
    del model, opt
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "world_size": world, "wall_s": wall, "samples": samples, "steps": steps,
            "train_phase_s": train_s, "eval_s": eval_s, "checkpoint_stall_s": 0.0,
            "history": history, "weights_sha256": sha, "effective_lr": lr, "step_ms": _step_ms(step_t),
            "cpu_s": cpu_all.item()}


def _trainer(args, cfg) -> dict:
    """``Trainer`` as training/worker.py drives it (minus export); returns rank 0's measurements."""
    import logging

    from core.manifest import read_dvc_file
    from training import trainer as trainer_mod
    from training.data import load_splits
    from training.distributed import all_reduce_sum, process_group
    from training.sink import MetricsSink
    from training.trainer import Trainer, state_dict_sha256

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    if args.worker == "lean-noagree":
        # The per-step preemption agreement, made local. any_rank's other callers in the
        # trainer module (early stopping) are off in this config; checkpoint.py keeps its own.
        trainer_mod.any_rank = lambda ctx, flag: bool(flag)
    t = cfg.training
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with process_group(t.backend, t.collective_timeout_s) as ctx:
        trainer = Trainer(cfg, ctx, load_splits(cfg, ROOT, cfg.seed), out, MetricsSink.for_rank(ctx.is_main),
                          cfg.config_id(), read_dvc_file(ROOT, cfg.dataset.dvc_file).md5)
        eval_s, step_t = [], []
        evaluate, train_step = trainer._evaluate, trainer.train_step

        def timed_evaluate():
            t1 = time.perf_counter()
            try:
                return evaluate()
            finally:
                eval_s.append(time.perf_counter() - t1)

        def timed_train_step(batch):
            step_t.append((trainer.epoch, time.perf_counter()))
            return train_step(batch)

        # Instrumentation on this instance only (the hand loop takes the same two readings).
        trainer._evaluate, trainer.train_step = timed_evaluate, timed_train_step
        try:
            cpu0 = time.process_time()
            fit = trainer.fit()
            cpu_all = all_reduce_sum(ctx, [time.process_time() - cpu0])[0]
            full = trainer.strategy.full_state_dict(trainer.model) if fit.status == "completed" else None
        finally:
            trainer.release()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "wall_s": fit.train_wall_s,
            "samples": trainer.n_train * len(fit.history),  # every sample once per epoch, as the hand loop counts
            "steps": trainer.step, "train_phase_s": [h.epoch_time_s for h in fit.history], "eval_s": eval_s,
            "checkpoint_stall_s": fit.checkpoint_stall_s,
            "history": [{"train_loss": h.train_loss, "val_loss": h.val_loss, "val_accuracy": h.val_accuracy}
                        for h in fit.history],
            "weights_sha256": state_dict_sha256(full) if full is not None else None,
            "effective_lr": fit.effective_lr, "status": fit.status, "step_ms": _step_ms(step_t),
            "cpu_s": cpu_all}


def worker_main(args) -> int:
    import torch

    from core.config import load_config

    overrides = [f"training.epochs={args.epochs}", f"training.batch_size={args.batch_size}",
                 *(LEAN if args.worker in ("lean", "lean-noagree") else [])]
    cfg = load_config(args.config, overrides)
    # training/worker.py's process settings: a property of the run, not of the loop
    torch.set_num_threads(cfg.training.threads_per_worker)
    if cfg.training.deterministic and args.worker != "hand-nodet":
        torch.use_deterministic_algorithms(True)
    res = _hand(args, cfg) if args.worker.startswith("hand") else _trainer(args, cfg)
    if res["rank"] == 0:
        res.update(mode=args.worker, epochs=cfg.training.epochs, samples_per_s=res["samples"] / res["wall_s"],
                   epoch_time_s=res["wall_s"] / cfg.training.epochs)
        tmp = Path(args.result).with_suffix(".tmp")
        tmp.write_text(json.dumps(res))
        tmp.replace(args.result)
    return 0


# -- parent side -----------------------------------------------------------------------------
def run_one(mode: str, args, workdir: Path, i: int) -> dict:
    result = workdir / f"{i:03d}_{mode}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
           str(Path(__file__).resolve()), "--worker", mode, "--result", str(result),
           "--out", str(workdir / f"{i:03d}_{mode}_out"), "--config", str(args.config),
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)]
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINFLOW_MLFLOW_RUN_ID", "TRAINFLOW_FAULT")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = python_path_with(ROOT, env.get("PYTHONPATH"))
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    if p.returncode != 0 or not result.is_file():
        raise RuntimeError(f"{mode} run failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-4000:]}")
    return {**json.loads(result.read_text()), "job_s": time.perf_counter() - t0}


def _fmt_loss_diff(d: float | None) -> str:
    return "-" if d is None else f"{d:.7f}"


def report(runs: dict[str, list[dict]], modes: list[str]) -> float | None:
    """Print the table of medians and the goals; returns lean/hand samples/s (None without both)."""
    def med(key):
        return {m: statistics.median(key(r) for r in runs[m]) for m in modes}

    sps = med(lambda r: r["samples_per_s"])
    ep = med(lambda r: r["epoch_time_s"])
    step = med(lambda r: r["step_ms"])
    ev = med(lambda r: statistics.fmean(r["eval_s"]))
    stall = med(lambda r: r["checkpoint_stall_s"] / r["epochs"])
    cpu = med(lambda r: 1e3 * r["cpu_s"] / r["steps"])
    hand = runs.get("hand")
    base = hand[0]["history"] if hand else None
    base_sha = hand[0]["weights_sha256"] if hand else None

    def loss_diff(m):
        """(max over runs of |final train loss - hand's|, the same over every epoch)."""
        if not base:
            return None, None
        final = max(abs(r["history"][-1]["train_loss"] - base[-1]["train_loss"]) for r in runs[m])
        every = max(abs(a["train_loss"] - b["train_loss"]) for r in runs[m] for a, b in zip(r["history"], base))
        return final, every

    def ratio(m, table, inverse=False):
        if "hand" not in table:
            return float("nan")
        return table["hand"] / table[m] if inverse else table[m] / table["hand"]

    print(f"\n{'mode':<13}{'samples/s':>10}{'ratio':>8}{'extra s/ep':>12}{'|dloss| final':>15}{'all epochs':>12}"
          "  weights")
    for m in modes:
        final, every = loss_diff(m)
        extra = ep[m] - ep["hand"] if "hand" in ep else float("nan")
        same = "-" if not base_sha else ("=hand" if {r["weights_sha256"] for r in runs[m]} == {base_sha} else "differ")
        print(f"{m:<13}{sps[m]:>10.0f}{ratio(m, sps):>8.3f}{extra:>+12.4f}{_fmt_loss_diff(final):>15}"
              f"{_fmt_loss_diff(every):>12}  {same}")
    print("medians over runs of the whole loop's wall time (per-epoch eval and checkpoints included); |dloss|: "
          "train loss vs hand's,\nfinal epoch and worst epoch; weights: final weights sha256 vs hand's")
    print(f"\n{'mode':<13}{'step ms':>9}{'step ratio':>12}{'cpu ms/step':>13}{'cpu ratio':>11}"
          f"{'eval s/ep':>11}{'ckpt s/ep':>11}")
    for m in modes:
        print(f"{m:<13}{step[m]:>9.3f}{ratio(m, step, True):>12.3f}{cpu[m]:>13.3f}{ratio(m, cpu, True):>11.3f}"
              f"{ev[m]:>11.4f}{stall[m]:>11.4f}")
    print("step ms: each run's median step-to-step interval (median over runs; shrugs off bursts of other load);\n"
          "cpu ms/step: CPU time of all ranks over the loop per optimizer step (less sensitive to other load than "
          "wall time);\nratios: hand's / this mode's; eval s/ep: the validation pass; ckpt s/ep: checkpoint stall "
          "(the copy;\nthe write runs in a background thread)\n")
    if "hand" not in sps:
        return None
    for m, goal in GOALS.items():
        if m not in sps:
            continue
        r = ratio(m, sps)
        ok = r >= goal
        line = (f"goal {m}: ratio {r:.3f} >= {goal:.2f}: {'met' if ok else 'not met'} "
                f"(step ratio {ratio(m, step, True):.3f}, cpu ratio {ratio(m, cpu, True):.3f})")
        if m == "lean":
            every = loss_diff(m)[1]
            equal = every is not None and every < 0.5 * 10 ** -LOSS_DECIMALS
            line += f"; train losses equal to {LOSS_DECIMALS} decimals every epoch: {'yes' if equal else 'no'}"
            ok = ok and equal
        print(f"{line} -> {'MET' if ok else 'MISSED'}")
    return sps["lean"] / sps["hand"] if "lean" in sps else None


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode, interleaved (default 3)")
    ap.add_argument("--epochs", type=int, default=12, help="epochs per run (default 12)")
    ap.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default 32)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma-separated, run in this order each repeat (default {','.join(MODES)}; "
                         f"diagnostic: {', '.join(DIAGNOSTIC)})")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "digits.yaml")
    ap.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds per torchrun job")
    ap.add_argument("--json", type=Path, help="also write every run's measurements here")
    for hidden in ("--worker", "--result", "--out"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES + DIAGNOSTIC]
    if unknown or not modes:
        ap.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES + DIAGNOSTIC)}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    print(f"parity: {args.nproc} procs x gloo/CPU, config {args.config.name}, epochs={args.epochs}, "
          f"batch={args.batch_size}/worker, modes={','.join(modes)}, repeats={args.repeats}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trainflow-parity-") as tmp:
        for rep in range(args.repeats):
            for j, m in enumerate(modes):
                try:
                    r = run_one(m, args, Path(tmp), rep * len(modes) + j)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    print(f"parity: {exc}", file=sys.stderr)
                    return 1
                runs[m].append(r)
                print(f"  [{rep + 1}/{args.repeats}] {m:<13} loop {r['wall_s']:6.3f} s  "
                      f"{r['samples_per_s']:7.0f} samples/s  final loss {r['history'][-1]['train_loss']:.7f}  "
                      f"(job {r['job_s']:.1f} s)", flush=True)
    first = runs[modes[0]][0]
    print(f"total {time.perf_counter() - t_all:.1f} s for {args.repeats * len(modes)} jobs; "
          f"{first['steps']} steps x {first['world_size']} ranks per run")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    ratio = report(runs, modes)
    if ratio is not None:
        print(f"parity_ratio={ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
