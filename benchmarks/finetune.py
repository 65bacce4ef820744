"""Fine-tuning parity: trainflow's Trainer on the text_classification task against a hand-written
``transformers`` DDP loop, and FSDP2's per-rank parameter + optimizer bytes against DDP's.

    python benchmarks/finetune.py                  # BERT 4 layers, hidden 256; 2 ranks x 3 rounds
    python benchmarks/finetune.py --rounds 5 --rows 4000 --layers 4 --hidden 256

The model is built from a config (random weights, ``transformers.BertConfig``) with a WordPiece
tokenizer trained on the benchmark's own texts (``tests/text_data.py``), saved as a model folder
and loaded through ``tasks.hf_folder`` like a user's. One ``torchrun --standalone`` job (this file in
``--worker`` mode) runs parity.py's rounds (``timed_rounds``): every mode once unrecorded (imports,
caches), then every mode once per round in an order rotated each round, each a whole timed training
(the loop only). Modes: ``hand`` (``transformers``' model under DDP, the same packed rows cut to each batch's
longest, the same sample order, LR schedule and precision), ``lean`` (Trainer, checkpoints and
metrics off), ``default`` (Trainer as shipped), and once ``fsdp`` (Trainer, ``training.strategy:
fsdp``: each BERT layer sharded, then the root) for its per-rank bytes. Ratios are paired per
round (hand's time over the mode's), then the median over rounds with its spread.

The last line: ``finetune_parity=<lean ÷ hand samples/s> fsdp_memory_ratio=<FSDP ÷ DDP per-rank
parameter and optimizer bytes>``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import parser
from parity import _trainer, fmt_spread, paired, timed_rounds, torchrun_job

LEAN = ["training.checkpoints=false", "training.metrics=false"]
MODES = {"hand": [], "lean": LEAN, "default": [], "fsdp": [*LEAN, "training.strategy=fsdp"]}
TIMED = ("hand", "lean", "default")
EXPECTATIONS = """version: 1
format: table
columns: [text]
label: category
labels: [billing, bug, praise]
rows: {train: [10, 1000000], test: [2, 1000000]}
"""


def make_root(root: Path, rows: int, layers: int, hidden: int) -> Path:
    """A project folder: ``rows`` tickets, a BERT folder built from a config, expectations, config."""
    import yaml

    from tests.hf_models import tiny_encoder
    from tests.text_data import tickets

    (root / ".dvc").mkdir(parents=True, exist_ok=True)
    (root / "data" / "tickets").mkdir(parents=True, exist_ok=True)
    df = tickets(rows, seed=3)
    df.to_csv(root / "data" / "tickets" / "tickets.csv", index=False)
    tiny_encoder(root / "models" / "bert", df["text"], hidden=hidden, layers=layers, vocab_size=2000, positions=128)
    (root / "tickets.expectations.yaml").write_text(EXPECTATIONS)
    cfg = {"name": "finetune", "task": "text_classification", "seed": 0,
           "dataset": {"path": "data/tickets", "dvc_file": "data/tickets.dvc", "file": "tickets.csv",
                       "label": "category", "expectations_file": "tickets.expectations.yaml"},
           "pretrained": {"path": "models/bert", "text_column": "text", "max_length": 64},
           "training": {"epochs": 2, "batch_size": 16, "base_batch": 16, "lr": 3e-4, "warmup_epochs": 0.1,
                        "strategy": "ddp", "timeout_s": 3000, "collective_timeout_s": 300},
           "registry": {"model_name": "finetune", "experiment": "trainflow-finetune"}}
    (root / "finetune.yaml").write_text(yaml.safe_dump(cfg))
    return root


def _hand(cfg, ctx, data, folder: Path) -> dict:
    """The hand-written loop: transformers' model under DDP, dict inputs cut to each batch's longest row."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tasks.hf_folder import load_model
    from training.trainer import lr_factor, scaled_lr

    t, rank, world = cfg.training, ctx.rank, ctx.world_size
    torch.manual_seed(cfg.seed)
    hf = load_model(folder, "sequence_classification", len(data.info.classes))
    hf.config.pad_token_id = data.info.pad_id
    model = DDP(hf)
    lr = scaled_lr(t.lr, t.batch_size * world, t.base_batch, t.lr_scaling)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=t.weight_decay)
    b, (x_all, y_all) = t.batch_size, data.train.tensors
    n_all, g_batch = len(x_all), t.batch_size * world
    xv, yv = (v[rank::world] for v in data.val.tensors)

    def forward(x):
        x = x[:, :1 + max(int(x[:, 0].max()), 1)]
        ids = x[:, 1:]
        mask = (torch.arange(ids.shape[1])[None, :] < x[:, :1]).long()
        return model(input_ids=ids, attention_mask=mask).logits

    wall0, samples = time.perf_counter(), 0
    model.train()
    for epoch in range(t.epochs):
        order = torch.randperm(n_all, generator=torch.Generator().manual_seed(cfg.seed + epoch))
        for start in range(0, n_all, g_batch):
            total = min(g_batch, n_all - start)
            idx = order[start:start + total][rank * b:(rank + 1) * b]
            if len(idx):
                loss = F.cross_entropy(forward(x_all[idx]).float(), y_all[idx], reduction="sum")
            else:  # an empty share of the last step: a 1-row pass times 0 keeps DDP's all-reduce in step
                loss = forward(torch.tensor([[1, data.info.pad_id]])).float().sum() * 0
            (loss * (world / total)).backward()
            if t.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            factor = lr_factor(epoch * n_all + start, total, t.warmup_epochs * n_all, t.epochs * n_all)
            for group in opt.param_groups:
                group["lr"] = lr * factor
            opt.step()
            opt.zero_grad(set_to_none=True)
            samples += total
        model.eval()
        with torch.no_grad():
            forward(xv)
        model.train()
    return {"wall_s": time.perf_counter() - wall0, "samples": samples}


def worker_main(args) -> int:
    import torch

    from core.config import load_config
    from training.data import load_splits
    from training.distributed import process_group

    root = Path(args.root)
    os.chdir(root)  # the project root the config's paths are relative to, as the launcher's cwd
    cfgs = {m: load_config(root / "finetune.yaml", [f"training.epochs={args.epochs}", *MODES[m]]) for m in MODES}
    warm = {m: load_config(root / "finetune.yaml", ["training.epochs=1", *MODES[m]]) for m in MODES}
    torch.set_num_threads(1)
    with process_group("gloo", 300) as ctx:
        data = load_splits(cfgs["lean"], root, 0)

        def run(i: int, r: int, m: str) -> dict:
            cfg = warm[m] if r < 0 else cfgs[m]
            if m == "hand":
                return _hand(cfg, ctx, data, root / "models" / "bert")
            res = _trainer(m, cfg, ctx, data, Path(args.out) / f"{i}", data_md5="bench")
            return {**res, "samples": len(data.train) * cfg.training.epochs}

        records = timed_rounds(ctx, list(TIMED), args.rounds, run,
                               lambda res: f"{res['samples'] / res['wall_s']:8.1f} samples/s",
                               extra=[(args.rounds, "fsdp"), (args.rounds, "lean")])
    if ctx.is_main:
        Path(args.result).write_text(json.dumps(records))
    return 0


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--root"), ap.add_argument("--out"), ap.add_argument("--result")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--nproc", type=int, default=2)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    with tempfile.TemporaryDirectory(prefix="finetune-") as tmp:
        root = make_root(Path(tmp) / "proj", args.rows, args.layers, args.hidden)
        argv = ["--root", str(root), "--out", str(Path(tmp) / "out"), "--rounds", str(args.rounds),
                "--epochs", str(args.epochs)]
        try:
            records = torchrun_job(Path(__file__).resolve(), args.nproc, argv, Path(tmp) / "result.json",
                                   Path(tmp) / "job.log", {"HF_HUB_OFFLINE": "1"})
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 1
    by: dict[str, dict[int, dict]] = {}
    for r in records:
        by.setdefault(r["mode"], {})[r["round"]] = r
    rate, wall = (lambda r: r["samples"] / r["wall_s"]), (lambda r: r["wall_s"])  # noqa: E731
    print(f"\nBERT {args.layers} layers, hidden {args.hidden}; {args.rows} texts; {args.nproc} gloo ranks x 1 thread; "
          f"{args.epochs} epochs per run, {args.rounds} rounds")
    print("| mode | samples/s (median) | ÷ hand: paired median [~90 % interval] (min-max) |\n|---|---|---|")
    ratios = {}
    for m in TIMED:
        ratio = paired(by, m, "hand", wall)  # hand's time over the mode's: the same samples
        ratios[m] = statistics.median(ratio)
        print(f"| {m} | {statistics.median(rate(by[m][r]) for r in range(args.rounds)):.1f} | {fmt_spread(ratio)} |")
    ddp, fsdp = by["lean"][args.rounds]["ranks"], by["fsdp"][args.rounds]["ranks"]
    mem = lambda ranks: max(r["param_bytes"] + r["optim_bytes"] for r in ranks)  # noqa: E731
    n_params = ddp[0]["param_bytes"] / 4
    print(f"\nper-rank parameter + optimizer bytes: DDP {mem(ddp) / 2**20:.1f} MiB, FSDP "
          f"{mem(fsdp) / 2**20:.1f} MiB ({n_params / 1e6:.1f} M parameters); default vs lean: "
          f"{ratios['default'] / ratios['lean']:.3f}")
    print(f"finetune_parity={ratios['lean']:.3f} fsdp_memory_ratio={mem(fsdp) / mem(ddp):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
