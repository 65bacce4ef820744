"""Loop parity: trainflow's ``Trainer`` against a plain hand-written DDP loop, in paired rounds.

    python benchmarks/parity.py                     # hand, hand-b, lean, default; 2 jobs x 5 rounds
    python benchmarks/parity.py --modes lean,default,default+costs,+metrics,+ckpt \
        --rounds 4 --jobs 1 --epochs 12             # what each default feature costs

Each job is one ``torchrun --standalone`` (this file in ``--worker`` mode) that joins the process group
once, runs every mode once for 2 epochs unrecorded (lazy imports, first-call caches), then every mode
once per round, in an order rotated each round, each as a whole timed training (the loop only: no
start-up, imports, data or model build). A round's modes share the
machine's load of the moment, so the benchmark compares modes by **paired ratios**: per round,
hand's time over the mode's, then the median over rounds with its spread (min-max, and a
distribution-free ~90 % interval of the median). ``hand-b`` is the hand loop again (A/A): its ratio's
interval is the resolution of the run. CPU time (all ranks, all threads, per optimizer step) is
less sensitive to other load than wall time and is reported beside it.

``hand`` (``_hand``) does the Trainer's work in the same numerical order (its seeds, sample order,
LR schedule, clipping, a validation pass per epoch), so equal final weights' sha256 means bit for
bit the same arithmetic; every run of every mode is checked against hand's. Modes: ``MODES``; the
feature modes add one default feature to lean, so their cost per step is the difference to lean;
``default+costs`` times each feature's own code (``COSTED``) on the thread that runs it, which needs
no pairing and resolves what the differences cannot on a loaded machine.
The last line is ``parity_ratio=<lean/hand>`` (median of the paired wall ratios).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, parser

from core.paths import python_path_with

LEAN = ["training.checkpoints=false", "training.metrics=false"]
# mode -> (loop, config overrides, what it is)
MODES = {
    "hand": ("hand", [], "the hand-written DDP loop"),
    "hand-b": ("hand", [], "the hand loop again: hand-b against hand is an A/A comparison (the resolution)"),
    "lean": ("trainer", LEAN, "Trainer, checkpoints and metrics off"),
    "default": ("trainer", [], "Trainer as shipped: every default feature on"),
    "+metrics": ("trainer", ["training.checkpoints=false"], "lean + metrics (step timing, comm timing, windows)"),
    "+ckpt": ("trainer", ["training.metrics=false"], "lean + checkpoints (epoch ends within training.checkpoint_budget)"),
    "default+costs": ("trainer", [], "default, with the CPU time of each feature's own code accounted"),
}
# default+costs: (what, where) -> CPU seconds on the thread that ran it, summed over ranks, less what
# the accounting itself adds to each call (measured on an empty function).
COSTED = (
    ("per-step metrics: data wait, step end", "training.metrics:StepMetrics.data_start"),
    ("per-step metrics: data wait, step end", "training.metrics:StepMetrics.data_end"),
    ("per-step metrics: data wait, step end", "training.metrics:StepMetrics.step_end"),
    ("metrics window: gather, straggler rule, metrics.jsonl", "training.trainer:Trainer._log_window"),
    ("checkpoint: RNG and loss gather", "training.trainer:Trainer.checkpoint_state"),
    ("checkpoint: budget agreement (an all-reduce at each epoch end)",
     "training.checkpoint:CheckpointManager.over_budget"),
    ("checkpoint: CPU copy of the state (training waits)", "training.checkpoint:CheckpointManager.save"),
    ("checkpoint: write (rank 0's background thread)", "training.checkpoint:CheckpointManager._write"),
    ("preemption agreement (all-reduce every 10 steps)", "training.trainer:any_rank"),
    ("goodput ledger heartbeat", "training.goodput:Ledger.step"),
)
COSTS: dict[str, float] = {}
CALLS: dict[str, int] = {}
DEFAULT_MODES = ("hand", "hand-b", "lean", "default")
LOSS_DECIMALS = 5
GOALS = {"lean": 1.00, "default": 0.97}  # paired wall ratio vs hand (median over rounds)
CPU_GOAL = 0.03  # default's CPU time per step within this of lean's


# -- worker side (one process of a torchrun job) ------------------------------------------
def _hand(mode: str, cfg, ctx, data) -> dict:
    """The plain loop on this rank; returns its measurements."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tasks import get_task
    from training.trainer import lr_factor, scaled_lr, state_dict_sha256

    t = cfg.training
    if t.grad_accum != 1:
        raise SystemExit("parity: the hand-written loop has no gradient accumulation; use grad_accum: 1")
    rank, world = ctx.rank, ctx.world_size
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

    history, steps = [], 0
    # No barrier: like the Trainer, the clock starts after DDP's construction broadcast and some
    # local set-up, and any skew left between the ranks is absorbed by the first step.
    cpu0, wall0 = time.process_time(), time.perf_counter()
    model.train()
    for epoch in range(t.epochs):
        # The Trainer's memory loader: a DataLoader would draw its seed from the global RNG,
        # shifting every dropout mask after it.
        order = torch.randperm(n_all, generator=torch.Generator().manual_seed(cfg.seed + epoch))
        loss_sum, n = 0.0, 0
        for start in range(0, n_all, g_batch):
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
        tot = torch.tensor([loss_sum, n], dtype=torch.float64)
        dist.all_reduce(tot)
        model.eval()
        with torch.no_grad():
            logits = model(xv)
            vsum = F.cross_entropy(logits, yv, reduction="sum").item()
            correct = (logits.argmax(1) == yv).sum().item()
        model.train()
        vt = torch.tensor([vsum, correct, len(yv)], dtype=torch.float64)
        dist.all_reduce(vt)
        loss_sum, n = tot.tolist()
        history.append({"train_loss": loss_sum / n, "val_loss": vt[0].item() / vt[2].item(),
                        "val_accuracy": vt[1].item() / vt[2].item()})
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    sha = state_dict_sha256(model.module.state_dict())
    del model, opt
    return {"wall_s": wall, "cpu_s": cpu, "steps": steps, "history": history, "weights_sha256": sha}


class _Patched:
    """``default+costs``' accounting wrapped around the library for one run, undone after it."""

    def __init__(self, mode: str):
        self.mode, self.undo = mode, []

    def _set(self, obj, name, value):
        self.undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def __enter__(self):
        if self.mode == "default+costs":
            import importlib

            COSTS.clear()
            CALLS.clear()
            for what, where in COSTED:
                module, _, attr = where.partition(":")
                owner, _, name = attr.rpartition(".")
                obj = getattr(importlib.import_module(module), owner) if owner else importlib.import_module(module)
                self._set(obj, name, _accounted(what, getattr(obj, name)))
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.undo):
            setattr(obj, name, value)


def _accounted(what: str, fn):
    def accounted(*args, **kwargs):
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            COSTS[what] = COSTS.get(what, 0.0) + time.thread_time() - t0
            CALLS[what] = CALLS.get(what, 0) + 1
    return accounted


def _accounting_overhead(n: int = 5000) -> float:
    """CPU seconds the accounting attributes to one call of an empty function (this thread)."""
    empty = _accounted("empty", lambda: None)
    for _ in range(n):
        empty()
    per_call = COSTS.pop("empty") / n
    CALLS.pop("empty")
    return per_call


def _trainer(mode: str, cfg, ctx, data, out: Path, data_md5: str | None = None) -> dict:
    """``Trainer`` as training/worker.py drives it (minus export) on this rank; returns its measurements
    (``data_md5``: the data's, by default its DVC file's)."""
    from core.manifest import read_dvc_file
    from training.sink import MetricsSink
    from training.trainer import Trainer, state_dict_sha256

    with _Patched(mode):
        sink = MetricsSink.for_rank(ctx.is_main, out, cfg.config_id())
        md5 = data_md5 or read_dvc_file(ROOT, cfg.dataset.dvc_file).md5
        trainer = Trainer(cfg, ctx, data, out, sink, cfg.config_id(), md5)
        try:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            fit = trainer.fit()
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            full = trainer.strategy.full_state_dict(trainer.model) if fit.status == "completed" else None
        finally:
            trainer.release()
            if trainer.ckpt._pool is not None:
                trainer.ckpt._pool.shutdown()
    return {"wall_s": wall, "cpu_s": cpu, "steps": trainer.step, "status": fit.status,
            "history": [{"train_loss": h.train_loss, "val_loss": h.val_loss, "val_accuracy": h.val_accuracy}
                        for h in fit.history],
            "weights_sha256": state_dict_sha256(full) if full is not None else None,
            "checkpoint_stall_s": fit.checkpoint_stall_s, "ranks": fit.ranks}


def order_of(modes: list[str], i: int) -> list[str]:
    """Round ``i``'s order: ``modes`` rotated by ``i``, so each mode takes each position equally often."""
    k = i % len(modes)
    return modes[k:] + modes[:k]


def timed_rounds(ctx, modes: list[str], rounds: int, run, describe, offset: int = 0, extra=()) -> list[dict]:
    """Every mode once unrecorded (lazy imports, first-call caches), then every mode once per round in
    ``order_of``'s order, then ``extra`` ((round, mode) pairs), each after a barrier. ``run(i, round,
    mode)`` (round -1: the warm-up) returns one measurement on every rank; rank 0 keeps them (the
    others get []) and prints each as a PROGRESS line, ``describe(measurement)``."""
    from training.distributed import barrier

    plan = [(-1, m) for m in modes]
    plan += [(offset + r, m) for r in range(rounds) for m in order_of(modes, offset + r)] + list(extra)
    records = []
    for i, (r, m) in enumerate(plan):
        gc.collect()
        barrier(ctx)
        res = run(i, r, m)
        gc.collect()
        if r >= 0 and ctx.is_main:
            records.append({"mode": m, "round": r, **res})
            print(f"PROGRESS round {r + 1} {m:<16} {describe(res)}", flush=True)
    return records


def worker_main(args) -> int:
    import logging

    import torch

    from core.config import load_config
    from training.data import load_splits
    from training.distributed import all_gather_object, all_reduce_sum, process_group

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    modes = args.modes.split(",")
    base = [f"training.epochs={args.epochs}", f"training.batch_size={args.batch_size}"]
    cfgs = {m: load_config(args.config, base + MODES[m][1]) for m in modes}
    warm = {m: load_config(args.config, [f"training.epochs={min(2, args.epochs)}", base[1], *MODES[m][1]])
            for m in modes}
    t = cfgs[modes[0]].training
    # training/worker.py's process settings: a property of the run, not of the loop
    torch.set_num_threads(t.threads_per_worker)
    if t.deterministic:
        torch.use_deterministic_algorithms(True)
    out_root = Path(args.out)
    with process_group(t.backend, t.collective_timeout_s) as ctx:
        data = load_splits(cfgs[modes[0]], ROOT, cfgs[modes[0]].seed)
        overhead = _accounting_overhead() if "default+costs" in modes else 0.0

        def run(i: int, r: int, m: str) -> dict:
            cfg, out = warm[m] if r < 0 else cfgs[m], out_root / f"{i:03d}_{m}"
            res = _hand(m, cfg, ctx, data) if MODES[m][0] == "hand" else _trainer(m, cfg, ctx, data, out)
            res["cpu_ranks"] = all_gather_object(ctx, res["cpu_s"])
            res["cpu_s"] = sum(res["cpu_ranks"])
            if m == "default+costs":
                names = list(dict.fromkeys(what for what, _ in COSTED))
                own = [max(0.0, COSTS.get(n, 0.0) - CALLS.get(n, 0) * overhead) for n in names]
                res["costs"] = dict(zip(names, all_reduce_sum(ctx, own)))
            return res

        records = timed_rounds(ctx, modes, args.rounds, run, lambda res: (
            f"loop {res['wall_s']:6.3f} s  cpu {1e3 * res['cpu_s'] / res['steps']:6.3f} ms/step  "
            f"final loss {res['history'][-1]['train_loss']:.7f}"), args.round_offset)
    if ctx.is_main:
        tmp = Path(args.result).with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        tmp.replace(args.result)
    return 0


# -- parent side -----------------------------------------------------------------------------
def torchrun_job(script: Path, nproc: int, argv: list[str], result: Path, log: Path, env: dict | None = None,
                 prefix: str = "  ", timeout: float | None = None) -> list[dict]:
    """``script --worker --result RESULT ARGV`` under ``torchrun --standalone`` (one thread per process,
    MLflow off: the pipeline's jobs relay the metrics file instead; ``env`` on top), its PROGRESS lines
    echoed after ``prefix``; returns the records it wrote. RuntimeError (with the log's tail) if it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(script), "--worker", "--result", str(result), *argv]
    full = {k: v for k, v in os.environ.items() if k != "TRAINFLOW_FAULT"}
    full.update(TRAINFLOW_MLFLOW_RUN_ID="", OMP_NUM_THREADS="1",
                PYTHONPATH=python_path_with(ROOT, full.get("PYTHONPATH")), **(env or {}))
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=err, text=True)
        for line in p.stdout:
            if line.startswith("PROGRESS "):
                print(prefix + line[9:].rstrip(), flush=True)
        rc = p.wait(timeout=timeout)
    if rc != 0 or not result.is_file():
        raise RuntimeError(f"{script.name} failed (exit {rc}):\n{log.read_text()[-4000:]}")
    return json.loads(result.read_text())


def run_job(args, workdir: Path, job: int, rounds: int, offset: int) -> list[dict]:
    """One torchrun job of ``rounds`` rounds."""
    argv = ["--out", str(workdir / f"job{job}"), "--config", str(args.config), "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--modes", ",".join(args.mode_list), "--rounds", str(rounds),
            "--round-offset", str(offset)]
    return torchrun_job(Path(__file__).resolve(), args.nproc, argv, workdir / f"job{job}.json",
                        workdir / f"job{job}.log", prefix=f"  job {job + 1}: ", timeout=args.run_timeout)


def median_interval(values: list[float]) -> tuple[float, float]:
    """A distribution-free interval for the median from order statistics: the narrowest whose coverage
    is >= 90 % (n = 10: the 2nd and 9th of the sorted values, 97.9 %; n < 5: min-max)."""
    xs, n = sorted(values), len(values)
    k = 0  # the largest k with P(xs[k] <= median <= xs[n-1-k]) = 1 - 2 P(Binomial(n, 1/2) <= k) >= 0.9
    for j in range(1, (n - 1) // 2 + 1):
        if 1 - 2 * sum(math.comb(n, i) for i in range(j + 1)) / 2 ** n < 0.9:
            break
        k = j
    return xs[k], xs[n - 1 - k]


def paired(by: dict, mode: str, ref: str, key) -> list[float]:
    """Per round where both ran: ``key(ref) / key(mode)`` (above 1: ``mode`` is faster or cheaper)."""
    return [key(by[ref][r]) / key(by[mode][r]) for r in sorted(by[mode]) if r in by[ref]]


def fmt_spread(values: list[float]) -> str:
    lo, hi = median_interval(values)
    return f"{statistics.median(values):.3f}  [{lo:.3f}, {hi:.3f}]  ({min(values):.3f}-{max(values):.3f})"


def report(records: list[dict], modes: list[str]) -> dict:
    """Print the tables and the goals; returns the medians of the paired ratios by name."""
    by: dict[str, dict[int, dict]] = {m: {} for m in modes}
    for rec in records:
        by[rec["mode"]][rec["round"]] = rec
    n = min(len(v) for v in by.values())
    wall, cpu = (lambda r: r["wall_s"]), (lambda r: r["cpu_s"] / r["steps"])
    out: dict[str, float] = {}
    hand = by.get("hand")
    base = next(iter(hand.values())) if hand else None

    def loss_diff(m):
        """Worst |train loss - hand's| over every run of ``m`` and every epoch."""
        return max(abs(a["train_loss"] - b["train_loss"]) for r in by[m].values()
                   for a, b in zip(r["history"], base["history"]))

    print(f"\n{n} rounds; ratios are hand's time / the mode's per round (above 1: faster than hand): "
          "median  [~90 % interval of the median]  (min-max)")
    print(f"{'mode':<16}{'loop s':>8}{'wall ratio vs hand':>40}{'cpu ms/step':>13}{'cpu ratio vs hand':>40}"
          f"{'|dloss|':>11}  weights")
    for m in modes:
        med_wall = statistics.median(wall(r) for r in by[m].values())
        med_cpu = 1e3 * statistics.median(cpu(r) for r in by[m].values())
        if hand and m != "hand":
            w, c = paired(by, m, "hand", wall), paired(by, m, "hand", cpu)
            out[m], out[m + ":cpu"] = statistics.median(w), statistics.median(c)
            out[m + ":interval"] = median_interval(w)
            ws, cs = fmt_spread(w), fmt_spread(c)
        else:
            ws = cs = "-"
        shas = {r["weights_sha256"] for r in by[m].values()}
        same = "-" if not base else ("=hand" if shas == {base["weights_sha256"]} else "differ")
        dl = f"{loss_diff(m):.2e}" if base else "-"
        print(f"{m:<16}{med_wall:>8.3f}{ws:>40}{med_cpu:>13.3f}{cs:>40}{dl:>11}  {same}")
    print("cpu: all ranks' CPU time (every thread) over the loop per optimizer step; |dloss|: worst train loss "
          "difference to hand's\nover every run and epoch; weights: every run's final weights sha256 against "
          "hand's")

    if "lean" in by:
        extra = [m for m in modes if m not in ("hand", "hand-b", "lean")]
        if extra:
            print(f"\nwhat each adds to lean, per optimizer step (median of the per-round differences; "
                  f"lean: {1e3 * statistics.median(cpu(r) for r in by['lean'].values()):.3f} ms CPU/step)")
            print(f"{'mode':<16}{'+cpu ms/step':>14}{'+cpu %':>9}{'+wall ms/step':>15}{'+wall %':>9}   what")
            for m in extra:
                rounds = [r for r in sorted(by[m]) if r in by["lean"]]
                d_cpu = [1e3 * (cpu(by[m][r]) - cpu(by["lean"][r])) for r in rounds]
                d_wall = [1e3 * (wall(by[m][r]) - wall(by["lean"][r])) / by[m][r]["steps"] for r in rounds]
                pct_cpu = statistics.median(cpu(by[m][r]) / cpu(by["lean"][r]) - 1 for r in rounds) * 100
                pct_wall = statistics.median(wall(by[m][r]) / wall(by["lean"][r]) - 1 for r in rounds) * 100
                print(f"{m:<16}{statistics.median(d_cpu):>+14.3f}{pct_cpu:>+8.1f}%{statistics.median(d_wall):>+15.3f}"
                      f"{pct_wall:>+8.1f}%   {MODES[m][2]}")
                if m == "default":
                    out["default_cpu_vs_lean"] = pct_cpu / 100
    if "default+costs" in by:
        ref = "lean" if "lean" in by else "default+costs"
        ref_cpu = statistics.median(cpu(r) for r in by[ref].values())
        print(f"\neach default feature's own CPU time per optimizer step, all ranks (default+costs; median over "
              f"{len(by['default+costs'])} runs; % of {ref}'s {1e3 * ref_cpu:.3f} ms CPU/step)")
        runs = list(by["default+costs"].values())
        for what in runs[0]["costs"]:
            per_step = statistics.median(r["costs"][what] / r["steps"] for r in runs)
            print(f"  {what:<56}{1e3 * per_step:>8.3f} ms{100 * per_step / ref_cpu:>7.1f} %")
            out[f"cost:{what}"] = per_step / ref_cpu
    if "hand-b" in by and hand:
        lo, hi = median_interval(paired(by, "hand-b", "hand", wall))
        clo, chi = median_interval(paired(by, "hand-b", "hand", cpu))
        res, cres = max(abs(lo - 1), abs(hi - 1)), max(abs(clo - 1), abs(chi - 1))
        # Each rank's own CPU ratio (rounds x ranks pairs): a rank's process CPU time, not the sum.
        ranks = range(len(hand[next(iter(hand))]["cpu_ranks"]))
        per_rank = [v for k in ranks for v in paired(by, "hand-b", "hand", lambda r: r["cpu_ranks"][k])]
        rlo, rhi = median_interval(per_rank)
        out["resolution"], out["resolution_cpu"] = res, cres
        out["resolution_cpu_rank"] = max(abs(rlo - 1), abs(rhi - 1))
        print(f"\nresolution (A/A, hand-b against hand): the interval of the median reaches {100 * res:.1f} % "
              f"from 1 in wall time, {100 * cres:.1f} % in CPU time (all ranks), "
              f"{100 * out['resolution_cpu_rank']:.1f} % in each rank's CPU time")
    if hand:
        for m, goal in GOALS.items():
            if m in out:
                lo, hi = out[m + ":interval"]
                print(f"goal {m}: wall ratio {out[m]:.3f} >= {goal:.2f}: {'met' if out[m] >= goal else 'not met'} "
                      f"(its interval [{lo:.3f}, {hi:.3f}]; cpu ratio {out[m + ':cpu']:.3f})")
        if "default_cpu_vs_lean" in out:
            d = out["default_cpu_vs_lean"]
            print(f"goal default cpu/step within {100 * CPU_GOAL:.0f} % of lean: {100 * d:+.1f} %: "
                  f"{'met' if d <= CPU_GOAL else 'not met'}")
        if "lean" in by:
            equal = loss_diff("lean") < 0.5 * 10 ** -LOSS_DECIMALS
            print(f"lean's train losses equal hand's to {LOSS_DECIMALS} decimals every epoch: "
                  f"{'yes' if equal else 'no'}")
    return out


def load_averages() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--rounds", type=int, default=10, help="rounds, each running every mode once (default 10)")
    ap.add_argument("--jobs", type=int, default=2, help="torchrun jobs the rounds are split over (default 2)")
    ap.add_argument("--epochs", type=int, default=24, help="epochs per timed training (default 24)")
    ap.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default 32)")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES),
                    help=f"comma-separated, from: {', '.join(MODES)} (default {','.join(DEFAULT_MODES)})")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "digits.yaml")
    ap.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    ap.add_argument("--run-timeout", type=float, default=900.0, help="seconds per torchrun job")
    ap.add_argument("--json", type=Path, help="also write every run's measurements here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for hidden, kind in (("--result", str), ("--out", str), ("--round-offset", int)):
        ap.add_argument(hidden, type=kind, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)

    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in MODES]
    if unknown or not args.mode_list or len(set(args.mode_list)) != len(args.mode_list):
        ap.error(f"--modes: unknown or repeated {unknown or args.mode_list}; choose from {', '.join(MODES)}")
    if args.rounds < 1 or not 1 <= args.jobs <= args.rounds:
        ap.error("--rounds must be >= 1 and --jobs between 1 and --rounds")
    print(f"parity: {args.nproc} procs x gloo/CPU, config {args.config.name}, epochs={args.epochs}, "
          f"batch={args.batch_size}/worker, modes={','.join(args.mode_list)}, rounds={args.rounds} in "
          f"{args.jobs} job(s); load average {load_averages()}", flush=True)
    t_all, records = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="trainflow-parity-") as tmp:
        done = 0
        for job in range(args.jobs):
            rounds = args.rounds // args.jobs + (job < args.rounds % args.jobs)
            try:
                records += run_job(args, Path(tmp), job, rounds, done)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"parity: {exc}", file=sys.stderr)
                return 1
            done += rounds
    first = records[0]
    print(f"total {time.perf_counter() - t_all:.1f} s for {len(records)} timed trainings; {first['steps']} "
          f"steps x {args.nproc} ranks each; load average {load_averages()}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
    out = report(records, args.mode_list)
    if "lean" in out:
        print(f"parity_ratio={out['lean']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
