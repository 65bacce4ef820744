"""Probe for training.strategies under torchrun (CPU/gloo): rank 0 writes one JSON of measurements.

Run: python -m torch.distributed.run --standalone --nproc-per-node 2 strategy_probe.py --out r.json --workdir D

Scenarios (every rank runs each; rank 0 records):
- ``curves``: DDP and FSDP train the same MLP on the same global batches; per-step global
  loss and grad norm, final weights (compared with a plain one-process run on rank 0).
- ``bytes``: per-rank param/grad/optimizer bytes after training, per strategy.
- ``resume``: train half, save, keep training (must equal the uninterrupted run); then a
  fresh model+optimizer loads the checkpoint and trains the second half (must equal too).
- ``full_state``: rank 0's full state dict in a plain model gives the wrapped model's outputs.
- ``accum``: two micro-steps (sync off, then on) vs one step on the double batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

from training.distributed import all_gather_object, all_reduce_sum, barrier, process_group
from training.checkpoint import load_state, save_state
from training.metrics import state_bytes
from training.parallel import build_strategy

DIMS = (64, 256, 256, 10)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(DIMS[0], DIMS[1]), nn.ReLU(),
        nn.Linear(DIMS[1], DIMS[2]), nn.ReLU(),
        nn.Linear(DIMS[2], DIMS[3]),
    )


def make_opt(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)


TEACHER = torch.randn(DIMS[0], DIMS[-1], generator=torch.Generator().manual_seed(42))


def global_batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``step`` of the stream: Gaussian inputs, labels from a fixed linear teacher (learnable)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(size, DIMS[0], generator=g)
    return x, (x @ TEACHER).argmax(1)


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = len(t) // world
    return t[rank * n:(rank + 1) * n]


def train(ctx, strat, wrapped, opt, start: int, steps: int, batch: int, clip: float | None) -> dict:
    """``steps`` optimizer steps from step ``start``; returns per-step global loss and grad norm."""
    losses, norms = [], []
    for i in range(start, start + steps):
        x, y = global_batch(i, batch)
        x, y = shard(x, ctx.rank, ctx.world_size), shard(y, ctx.rank, ctx.world_size)
        opt.zero_grad(set_to_none=True)
        with strat.autocast():
            loss = F.cross_entropy(wrapped(x.to(ctx.device)), y.to(ctx.device))
        loss.backward()
        if clip is not None:
            norms.append(strat.clip_grad_norm(wrapped, clip))
        opt.step()
        (total,) = all_reduce_sum(ctx, [loss.item()])
        losses.append(total / ctx.world_size)
    return {"losses": losses, "norms": norms}


def plain_run(steps: int, batch: int, opt_kind: str, clip: float | None) -> tuple[dict, dict]:
    """The same training in one process on the whole global batch (rank 0 only, no collectives)."""
    model = make_model(0)
    opt = make_opt(model, opt_kind)
    losses, norms = [], []
    for i in range(steps):
        x, y = global_batch(i, batch)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if clip is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms}, {k: v.clone() for k, v in model.state_dict().items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def release(*objs) -> None:
    """Drop wrappers before the process group goes (DDP's reducer holds it)."""
    del objs
    gc.collect()


@record
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="global batch")
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--strategies", default="ddp,fsdp")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    out: dict = {"args": vars(args), "timing_s": {}}
    steps, batch, half = args.steps, args.batch, args.steps // 2
    names = args.strategies.split(",")

    with process_group("gloo", timeout_s=90) as ctx:
        out["world_size"] = ctx.world_size
        out["startup_s"] = time.perf_counter() - t_start
        finals: dict[str, dict] = {}
        for name in names:
            rec: dict = {}
            out[name] = rec
            t0 = time.perf_counter()
            strat = build_strategy(name, ctx)

            # -- curves + bytes: the uninterrupted run ------------------------------------
            wrapped = strat.wrap(make_model(0).to(ctx.device))
            opt = make_opt(wrapped, args.optimizer)
            before = state_bytes(wrapped, opt)
            run = train(ctx, strat, wrapped, opt, 0, steps, batch, args.clip)
            rec["losses"], rec["norms"] = run["losses"], run["norms"]
            rec["bytes_before"] = before
            rec["bytes_after"] = state_bytes(wrapped, opt)
            rec["bytes_per_rank"] = all_gather_object(ctx, rec["bytes_after"])
            rec["wrapped_type"] = type(wrapped).__name__
            rec["param_types"] = sorted({type(p).__name__ for p in wrapped.parameters()})

            # -- full state dict: rank 0's copy in a plain model ---------------------------
            full = strat.full_state_dict(wrapped)
            rec["full_state_is_none_by_rank"] = all_gather_object(ctx, full is None)
            xp, _ = global_batch(9999, 8)  # same input on every rank
            with torch.no_grad():
                y_wrapped = wrapped(xp.to(ctx.device)).cpu()
            if ctx.is_main:
                plain = make_model(7)
                plain.load_state_dict(full)  # strict: same keys as the unwrapped model
                with torch.no_grad():
                    y_plain = plain(xp)
                rec["full_state_keys"] = sorted(full)
                rec["full_state_plain_tensors"] = all(type(v) is torch.Tensor and v.device.type == "cpu"
                                                      for v in full.values())
                rec["full_state_output_max_diff"] = (y_plain - y_wrapped).abs().max().item()
                finals[name] = full
            t_curves = time.perf_counter() - t0
            release(wrapped, opt)

            # -- resume: save at half-way, continue; fresh model loads, continues ----------
            t0 = time.perf_counter()
            folder = Path(args.workdir) / name
            folder.mkdir(parents=True, exist_ok=True)
            barrier(ctx)
            wrapped = strat.wrap(make_model(0).to(ctx.device))
            opt = make_opt(wrapped, args.optimizer)
            # A save before the first step must leave the optimizer untouched (DCP's
            # get_state_dict would otherwise leave AdamW at step=1): first half still matches.
            fresh = Path(args.workdir) / f"{name}_fresh"
            fresh.mkdir(parents=True, exist_ok=True)
            save_state(strat, wrapped, opt, {"step": 0}, fresh)
            rec["fresh_save_optimizer_untouched"] = len(opt.state) == 0
            first = train(ctx, strat, wrapped, opt, 0, half, batch, args.clip)
            extra = {"step": half, "tag": name, "rng": torch.get_rng_state(), "hist": first["losses"]}
            t_save = time.perf_counter()
            save_state(strat, wrapped, opt, extra, folder)
            rec["save_s"] = time.perf_counter() - t_save
            cont = train(ctx, strat, wrapped, opt, half, steps - half, batch, args.clip)
            rec["resume_first_half"] = first["losses"]
            rec["resume_continued"] = cont["losses"]
            release(wrapped, opt)

            wrapped = strat.wrap(make_model(123).to(ctx.device))  # other weights: load must replace them
            opt = make_opt(wrapped, args.optimizer)
            t_load = time.perf_counter()
            got = load_state(strat, wrapped, opt, folder)
            rec["load_s"] = time.perf_counter() - t_load
            rec["loaded_extra_ok"] = (got["step"] == half and got["tag"] == name
                                      and got["hist"] == first["losses"]
                                      and torch.equal(got["rng"], extra["rng"]))
            loaded = train(ctx, strat, wrapped, opt, half, steps - half, batch, args.clip)
            rec["resume_loaded"] = loaded["losses"]
            rec["ckpt_files"] = sorted(p.name for p in folder.iterdir())
            release(wrapped, opt)

            # -- a missing checkpoint raises on every rank (no hang) -----------------------
            empty = Path(args.workdir) / f"{name}_empty"
            empty.mkdir(parents=True, exist_ok=True)
            barrier(ctx)
            wrapped = strat.wrap(make_model(0).to(ctx.device))
            opt = make_opt(wrapped, args.optimizer)
            try:
                load_state(strat, wrapped, opt, empty)
                rec["missing_raises"] = False
            except Exception as exc:  # noqa: BLE001 - recorded
                rec["missing_raises"] = type(exc).__name__
            rec["missing_raises_all"] = all_gather_object(ctx, rec["missing_raises"])

            # -- a truncated checkpoint file raises on every rank (no hang) ----------------
            bad = Path(args.workdir) / f"{name}_corrupt"
            if ctx.is_main:
                shutil.copytree(folder, bad)
                victim = bad / ("__1_0.distcp" if name == "fsdp" else "__0_0.distcp")
                victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
            barrier(ctx)
            try:
                load_state(strat, wrapped, opt, bad)
                corrupt = False
            except Exception as exc:  # noqa: BLE001 - recorded
                corrupt = type(exc).__name__
            rec["corrupt_raises_all"] = all_gather_object(ctx, corrupt)
            release(wrapped, opt)
            t_resume = time.perf_counter() - t0

            # -- grad accumulation: sync off then on vs one step on the double batch -------
            t0 = time.perf_counter()
            x, y = global_batch(5000, 2 * batch)
            xs = shard(x, ctx.rank, ctx.world_size)  # this rank's 2*batch/world rows
            ys = shard(y, ctx.rank, ctx.world_size)
            m = len(xs) // 2
            results = {}
            for mode in ("accum", "accum_restore", "once"):
                wrapped = strat.wrap(make_model(0).to(ctx.device))
                opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
                if mode.startswith("accum"):
                    with strat.sync_context(wrapped, sync=False):
                        (F.cross_entropy(wrapped(xs[:m]), ys[:m]) / 2).backward()
                    # after a no-sync micro-step: DDP grads differ across ranks (local only);
                    # FSDP keeps unsharded grads to itself (sharded .grad not yet set).
                    g = [p.grad for p in wrapped.parameters()]
                    rec["nosync_grad_none"] = all(t is None for t in g)
                    local = [float(t.double().norm()) if t is not None else None for t in g]
                    rec["nosync_grad_norms_by_rank"] = all_gather_object(ctx, local)
                    # accum_restore: no context on the last micro-step, relying on the
                    # previous context having restored gradient sync on exit.
                    sync = strat.sync_context(wrapped, sync=True) if mode == "accum" else nullcontext()
                    with sync:
                        (F.cross_entropy(wrapped(xs[m:]), ys[m:]) / 2).backward()
                else:
                    F.cross_entropy(wrapped(xs), ys).backward()
                opt.step()
                results[mode] = strat.full_state_dict(wrapped)
                release(wrapped, opt)
            if ctx.is_main:
                rec["accum_max_param_diff"] = max_diff(results["accum"], results["once"])
                rec["accum_bitwise"] = all(torch.equal(results["accum"][k], results["once"][k])
                                           for k in results["accum"])
                rec["accum_restore_max_param_diff"] = max_diff(results["accum_restore"], results["once"])
                rec["accum_step_size"] = max_diff(results["once"], make_model(0).state_dict())
            rec["timing_s"] = {"curves": t_curves, "resume": t_resume, "accum": time.perf_counter() - t0}

        if ctx.is_main:
            ref, ref_final = plain_run(steps, batch, args.optimizer, args.clip)
            out["plain"] = ref
            for name in names:
                out[name]["final_vs_plain_max_diff"] = max_diff(finals[name], ref_final)
            if {"ddp", "fsdp"} <= set(names):
                out["ddp_vs_fsdp_final_max_diff"] = max_diff(finals["ddp"], finals["fsdp"])
        out["total_s"] = time.perf_counter() - t_start
        if ctx.is_main:
            Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
