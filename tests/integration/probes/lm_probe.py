"""Train the byte LM through ``training.worker.train_and_report`` on token windows built here.

Run (any strategy; ``--set`` takes the config's dotted overrides):

    python -m torch.distributed.run --standalone --nproc-per-node 2 lm_probe.py --out D \
        --set training.strategy=tp --set training.cpu_workers=2 --set training.parallel.tp=2

The text is a few standard-library modules read in sorted order (the same bytes on
every rank and every run of this interpreter); windows of ``seq_len + 1`` bytes give
``x`` (the first ``seq_len``) and ``y`` (the next-byte targets). Rank 0 writes the
worker's usual ``result.json``, ``weights.pt`` and ``model.pt2`` into ``--out``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from core.config import config_from_dict, read_config_data
from tasks.splits import Splits
from training.worker import train_and_report

# The probe's config (its corpus is made in memory by lm_splits; no file is read).
BASE = read_config_data(Path(__file__).with_name("lm-probe.yaml"))


def corpus() -> bytes:
    import bisect
    import heapq
    import string
    import textwrap

    files = sorted(inspect.getsourcefile(m) for m in (bisect, heapq, string, textwrap))
    return b"".join(Path(f).read_bytes() for f in files)


def lm_splits(seq_len: int, n_train: int, n_val: int, n_test: int) -> Splits:
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).long()
    n = n_train + n_val + n_test
    if len(data) < n * seq_len + 1:
        raise SystemExit(f"corpus of {len(data)} bytes is too short for {n} windows of {seq_len}")
    windows = torch.stack([data[i * seq_len: i * seq_len + seq_len + 1] for i in range(n)])
    x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    cut = [n_train, n_train + n_val]
    return Splits(train=TensorDataset(x[:cut[0]], y[:cut[0]]), val=TensorDataset(x[cut[0]:cut[1]], y[cut[0]:cut[1]]),
                  test=TensorDataset(x[cut[1]:], y[cut[1]:]))


@record
def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--n-train", type=int, default=64)
    ap.add_argument("--n-val", type=int, default=16)
    ap.add_argument("--force-resume", action="store_true")
    args = ap.parse_args(argv)
    cfg = config_from_dict(BASE, args.overrides)
    torch.set_num_threads(cfg.training.threads_per_worker)
    torch.use_deterministic_algorithms(True)
    splits = lm_splits(cfg.model.seq_len, args.n_train, args.n_val, 8)
    train_and_report(cfg, splits, args.out, "probe-data", args.force_resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
