"""Resize and strategy switch against uninterrupted runs: test accuracy and the loss curve after it.

    python benchmarks/resize.py                        # configs/digits.yaml, resize half-way
    python benchmarks/resize.py --config tests/configs/digits-quick.yaml --at 21

A resized run is two launcher jobs on one ``--out``: the first preempted at step ``--at``
(``TRAINFLOW_FAULT=sigterm@step=AT``), the second resuming on another layout. Deltas are not
bitwise: reduction order and dropout streams change with the layout. Last line:
``resize_max_test_acc_delta=<worst case>``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import ROOT, parser


def _train(config: Path, out: Path, nproc: int, overrides: list[str], fault: str | None = None) -> dict:
    from core.config import load_config
    from core.errors import PreemptedError
    from training.launcher import make_spec, run_job
    from training.plan import HostFacts, plan_launch

    cfg = load_config(config, overrides)
    env = {"TRAINFLOW_FAULT": fault} if fault else None
    spec = make_spec(plan_launch(cfg, HostFacts(), nproc), out, ROOT, "benchmark-data-md5", env=env)
    try:
        return run_job(spec)
    except PreemptedError:
        return json.loads((out / "result.json").read_text())


def _test_accuracy(config: Path, out: Path) -> float:
    import torch

    from core.config import load_config
    from training.data import load_splits
    from tasks import get_task

    cfg = load_config(config)
    splits = load_splits(cfg, ROOT, cfg.seed)
    model = get_task(cfg.task).build_model(cfg, splits.info)
    model.load_state_dict(torch.load(out / "weights.pt", weights_only=True))
    model.eval()
    x, y = splits.test.tensors
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "digits.yaml")
    ap.add_argument("--at", type=int, default=None, help="step of the resize (default: half of the run's steps)")
    args = ap.parse_args(argv)
    base = ["training.preempt_check_steps=1", "training.timeout_s=600"]
    cases = {"2->1": (2, [], 1, []), "1->2": (1, [], 2, []),
             "ddp->fsdp": (2, ["training.strategy=ddp"], 2, ["training.strategy=fsdp"])}
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory(prefix="trainflow-resize-") as tmp:
        clean = {}
        for nproc in (2, 1):
            out = Path(tmp) / f"clean{nproc}"
            clean[nproc] = (_train(args.config, out, nproc, base), _test_accuracy(args.config, out))
        for name, (n1, o1, n2, o2) in cases.items():
            ref, ref_acc = clean[n1]
            at = args.at or ref["steps"] // 2
            out = Path(tmp) / name.replace(">", "")
            first = _train(args.config, out, n1, base + o1, fault=f"sigterm@step={at}")
            assert first["status"] == "preempted" and first["steps"] == at, first.get("status")
            r = _train(args.config, out, n2, base + o2)
            acc = _test_accuracy(args.config, out)
            resized_epoch = first["epochs_run"]  # epochs complete before the resize
            after = list(zip(r["history"], ref["history"]))[resized_epoch:]
            d_train = max(abs(a["train_loss"] - b["train_loss"]) for a, b in after)
            d_val = max(abs(a["val_loss"] - b["val_loss"]) for a, b in after)
            worst = max(worst, abs(acc - ref_acc))
            rows.append((name, at, r["batch_policy"]["decision"], r["global_batch"], acc, ref_acc, d_train, d_val))
    print(f"{'case':10} {'at':>4} {'policy':18} {'G':>3} {'test acc':>8} {'clean':>7} {'|d acc|':>8} "
          f"{'max|d train|':>12} {'max|d val|':>10}")
    for name, at, decision, g, acc, ref_acc, d_train, d_val in rows:
        print(f"{name:10} {at:4d} {decision:18} {g:3d} {acc:8.4f} {ref_acc:7.4f} {abs(acc - ref_acc):8.4f} "
              f"{d_train:12.5f} {d_val:10.5f}")
    print(f"resize_max_test_acc_delta={worst:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
