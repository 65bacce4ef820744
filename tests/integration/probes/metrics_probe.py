"""Probe for training.metrics under torchrun (2 CPU ranks, gloo); rank 0 writes a JSON report.

    python -m torch.distributed.run --standalone --nproc-per-node 2 metrics_probe.py OUT.json

1. The same tiny DDP run with and without ``StepMetrics.attach``: final
   weights must be bitwise equal; the hooked run's ``snapshot()`` must carry sane values.
2. A run where rank 1 sleeps every step: per-rank raw stats, to see what a straggler
   looks like to the aggregation (recorded, not asserted: timing).
3. ``tensor_bytes`` / ``state_bytes`` on DTensors (a Shard(0) tensor, an FSDP2 model):
   the local shard is what counts.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from training.distributed import all_gather_object, process_group
from training.metrics import StepMetrics, state_bytes, tensor_bytes

STEPS = 20
BATCH = 8


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for key, t in sorted(model.state_dict().items()):
        h.update(key.encode())
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train(ctx, hook: bool, steps: int = STEPS, slow_rank: int | None = None, slow_s: float = 0.0):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    # A small bucket cap so the model spans several buckets.
    ddp = DDP(model, bucket_cap_mb=0.01)
    metrics = StepMetrics(ctx)
    if hook:
        metrics.attach(ddp)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    n = steps * BATCH * ctx.world_size
    ds = TensorDataset(torch.randn(n, 16, generator=g), torch.randint(0, 4, (n,), generator=g))
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, shuffle=False))
    it = iter(loader)
    digest_init = weights_digest(model)
    metrics.reset()
    for _ in range(steps):
        metrics.data_start()
        x, y = next(it)
        metrics.data_end()
        if ctx.rank == slow_rank:
            time.sleep(slow_s)
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        metrics.step_end(len(x))
    metrics.add_checkpoint_stall(0.01)
    raw = all_gather_object(ctx, metrics._local_stats())
    snap = metrics.snapshot()
    digest = weights_digest(model)
    del ddp, opt  # drop the reducer before the process group goes (see Trainer.release)
    gc.collect()
    return snap, raw, digest, digest_init


def dtensor_checks(ctx) -> dict:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    full = torch.zeros(8, 4)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    full_param_bytes = tensor_bytes(model.parameters())
    n_params = len(list(model.parameters()))
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    sb = state_bytes(model, opt)
    return {"dt_bytes": tensor_bytes([dt]), "full_bytes": tensor_bytes(full), "full_param_bytes": full_param_bytes,
            "n_params": n_params, "state": sb}


@record
def main() -> None:
    out = sys.argv[1]
    with process_group(backend="gloo", timeout_s=60) as ctx:
        snap_plain, _, digest_plain, digest_init = train(ctx, hook=False)
        snap_hook, raw_hook, digest_hook, _ = train(ctx, hook=True)
        snap_slow, raw_slow, _, _ = train(ctx, hook=True, steps=10, slow_rank=1, slow_s=0.03)
        dt = dtensor_checks(ctx)
        report = all_gather_object(ctx, {
            "rank": ctx.rank,
            "digest_init": digest_init,
            "digest_plain": digest_plain,
            "digest_hook": digest_hook,
            "snapshot_is_none": snap_hook is None,
            "dtensor": dt,
        })
        if ctx.is_main:
            with open(out, "w") as f:
                json.dump({"ranks": report, "snapshot_plain": snap_plain, "snapshot_hook": snap_hook,
                           "raw_hook": raw_hook, "snapshot_slow": snap_slow, "raw_slow": raw_slow}, f, indent=1)


if __name__ == "__main__":
    main()
