"""Images per second of the image task: its input pipeline alone, then training on 1 and 2 CPU workers.

    .venv/bin/python benchmarks/image_throughput.py                  # the bundled 8x8 digit images
    .venv/bin/python benchmarks/image_throughput.py --size 32 32     # the same files, resized bigger
    python benchmarks/image_throughput.py --device cuda              # on a GPU host: + 1 GPU worker

The input pipeline in this process: a cold Pillow decode (``decode_files``) against a second
``cached_pixels`` call (the key's ``stat`` of every file, then the memory-mapped ``.npy`` copied into
memory). Training through ``make_spec`` + ``run_job`` with checkpoints off; images/s is the result's
``samples_per_s`` (training-loop time only); ``--device cuda`` exits 2 where CUDA is unavailable.
Everything goes to a temporary ``TRAINFLOW_HOME`` it removes. Last line: ``decode_images_per_s=...
cached_images_per_s=... cached_vs_decode=... train_1w_images_per_s=... train_2w_images_per_s=...
train_2w_vs_1w=...`` (+ ``train_cuda_images_per_s`` and ``cuda_vs_1w`` with ``--device cuda``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from common import ROOT, parser, rounds, table


def pipeline(cfg, home: Path, repeats: int) -> dict:
    """Seconds of a cold decode and of the cached path over the train split; the cache is warmed here
    for both splits (the training jobs map it instead of decoding)."""
    from tasks.image_data import cached_pixels, decode_files, list_images

    entries = list_images(cfg.dataset, ROOT, cfg.seed)
    base = ROOT / cfg.dataset.path
    paths = [p for p, _ in entries["train"]]
    size, channels = tuple(cfg.dataset.images.size), cfg.dataset.images.channels
    t0 = time.perf_counter()
    first = np.array(cached_pixels(cfg.dataset, ROOT, "train", paths, home))
    first_s = time.perf_counter() - t0
    cached_pixels(cfg.dataset, ROOT, "test", [p for p, _ in entries["test"]], home)
    times: dict[str, list[float]] = {"decode": [], "cached": []}
    for i in range(repeats):
        for kind in rounds(("decode", "cached"), i):
            t0 = time.perf_counter()
            if kind == "decode":
                x = decode_files(base, paths, size, channels)
            else:
                mapped = cached_pixels(cfg.dataset, ROOT, "train", paths, home)
                assert isinstance(mapped, np.memmap), "the second cached_pixels call did not map the .npy"
                x = np.array(mapped)
            times[kind].append(time.perf_counter() - t0)
            assert np.array_equal(x, first)
    return {"n": len(paths), "first_s": first_s, **{k: statistics.median(v) for k, v in times.items()}}


def n_train(cfg) -> int:
    """Train images after the validation holdout (what one epoch trains on)."""
    from tasks.image_data import list_images
    from tasks.splits import stratified_holdout

    labels = np.asarray([label for _, label in list_images(cfg.dataset, ROOT, cfg.seed)["train"]])
    keep, _ = stratified_holdout(labels, cfg.dataset.val_fraction, cfg.seed)
    return len(keep)


LAYOUTS = {  # name -> (overrides, nproc)
    "1 CPU worker": (["training.strategy=single", "training.cpu_workers=1", "training.backend=gloo"], 1),
    "2 CPU workers": (["training.strategy=ddp", "training.cpu_workers=2", "training.backend=gloo"], 2),
    "1 GPU (cuda)": (["training.strategy=single", "training.cpu_workers=1", "training.backend=nccl"], 1),
}


def train(config: Path, base_sets: list[str], layout: str, work: Path, home: Path, images: int) -> dict:
    from core.config import load_config
    from training.launcher import make_spec, run_job
    from training.plan import HostFacts, plan_launch

    sets, nproc = LAYOUTS[layout]
    cfg = load_config(config, [*base_sets, *sets])
    out = Path(tempfile.mkdtemp(dir=work, prefix="job-")) / "out"
    spec = make_spec(plan_launch(cfg, HostFacts(), nproc), out, ROOT, "bench-data-md5", env={"TRAINFLOW_HOME": str(home)})
    t0 = time.perf_counter()
    result = run_job(spec)
    job_s = time.perf_counter() - t0
    if result.get("status") != "completed":
        raise SystemExit(f"{layout}: training ended {result.get('status')!r}")
    epochs = result["epochs_run"]
    return {"samples_per_s": result["samples_per_s"], "wall_images_per_s": images * epochs / result["train_wall_s"],
            "train_wall_s": result["train_wall_s"], "job_s": job_s, "backend": result["backend"],
            "world": result["world_size"], "val_accuracy": result["final"].get("val_accuracy")}


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "digit-images.yaml")
    ap.add_argument("--size", type=int, nargs=2, metavar=("H", "W"), help="dataset.images.size (default: the config's)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="decode / cached timings, alternating (medians)")
    ap.add_argument("--train-repeats", type=int, default=3, help="training runs per layout, alternating (medians)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: also train the 1-worker job on one GPU (CUDA must be available)")
    args = ap.parse_args(argv)
    if args.size is not None and min(args.size) < 1:
        ap.error(f"--size: height and width must be positive, got {args.size}")
    if min(args.epochs, args.repeats, args.train_repeats) < 1:
        ap.error("--epochs, --repeats and --train-repeats must be >= 1")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda, but torch.cuda.is_available() is False here (torch "
                  f"{torch.__version__}, CUDA build {torch.version.cuda}): run it on a GPU host or drop --device",
                  file=sys.stderr)
            return 2
    from core.config import load_config

    base_sets = [f"training.epochs={args.epochs}", "training.checkpoints=false", "training.timeout_s=300"]
    if args.size is not None:
        base_sets.append(f"dataset.images.size=[{args.size[0]},{args.size[1]}]")
    cfg = load_config(args.config, base_sets)
    h, w = cfg.dataset.images.size
    work = Path(tempfile.mkdtemp(prefix="trainflow-image-throughput-"))
    home = work / "home"
    layouts = ["1 CPU worker", "2 CPU workers"]
    runs: dict[str, list[dict]] = {k: [] for k in layouts + (["1 GPU (cuda)"] if args.device == "cuda" else [])}
    try:
        with mock.patch.dict(os.environ, TRAINFLOW_HOME=str(home)):  # this process and the workers: the cache goes here
            p = pipeline(cfg, home, args.repeats)
            images = n_train(cfg)
            order = [lay for i in range(args.train_repeats) for lay in rounds(layouts, i)]
            order += ["1 GPU (cuda)"] * args.train_repeats if args.device == "cuda" else []
            for layout in order:
                r = train(args.config, base_sets, layout, work, home, images)
                runs[layout].append(r)
                print(f"{layout}: {r['samples_per_s']:,.0f} images/s, train wall {r['train_wall_s']:.2f} s, "
                      f"job {r['job_s']:.1f} s ({r['backend']}, world {r['world']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: {f: statistics.median(r[f] for r in rs) for f in ("samples_per_s", "wall_images_per_s", "job_s")}
           for k, rs in runs.items()}
    rate = {"decode": p["n"] / p["decode"], "cached": p["n"] / p["cached"], "first": p["n"] / p["first_s"]}
    print(f"\ninput pipeline: {p['n']} train files, {h}x{w}x{cfg.dataset.images.channels}, medians of {args.repeats}")
    table(["path", "images/s", "ms per pass"], [
        ["cold decode (Pillow, `decode_files`)", f"{rate['decode']:,.0f}", f"{p['decode'] * 1e3:.1f}"],
        ["cached (`cached_pixels` again: mmap'd .npy, copied)", f"{rate['cached']:,.0f}", f"{p['cached'] * 1e3:.1f}"],
        ["first `cached_pixels` (decode + write .npy), once", f"{rate['first']:,.0f}", f"{p['first_s'] * 1e3:.1f}"]])
    print(f"cached / cold decode: {rate['cached'] / rate['decode']:.1f}x")
    print(f"\ntraining: {images} train images x {args.epochs} epochs, medians of {args.train_repeats}")
    table(["layout", "images/s (samples_per_s)", "images x epochs / train_wall_s", "job wall s"],
          [[k, f"{v['samples_per_s']:,.0f}", f"{v['wall_images_per_s']:,.0f}", f"{v['job_s']:.1f}"]
           for k, v in med.items()])
    one, two = med["1 CPU worker"]["samples_per_s"], med["2 CPU workers"]["samples_per_s"]
    ratio = two / one
    if ratio < 1:
        print(f"2 CPU workers LOSE to 1 on this machine: {two:,.0f} vs {one:,.0f} images/s ({ratio:.2f}x); "
              f"train this task with 1 worker here (training.strategy=single, training.cpu_workers=1)"
              + (" - by less than 5 %, within a shared machine's noise (more --train-repeats to tell)."
                 if ratio > 0.95 else "."))
    else:
        print(f"2 CPU workers beat 1 on this machine: {two:,.0f} vs {one:,.0f} images/s ({ratio:.2f}x).")
    line = (f"decode_images_per_s={rate['decode']:.0f} cached_images_per_s={rate['cached']:.0f} "
            f"cached_vs_decode={rate['cached'] / rate['decode']:.1f} train_1w_images_per_s={one:.0f} "
            f"train_2w_images_per_s={two:.0f} train_2w_vs_1w={ratio:.2f}")
    if "1 GPU (cuda)" in med:
        gpu = med["1 GPU (cuda)"]["samples_per_s"]
        print(f"1 GPU vs 1 CPU worker: {gpu / one:.1f}x")
        line += f" train_cuda_images_per_s={gpu:.0f} cuda_vs_1w={gpu / one:.2f}"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
