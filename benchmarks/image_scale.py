"""Sharded images at two sizes: validation and streamed-training RSS, input images/s by workers, cached vs streamed.

    .venv/bin/python benchmarks/image_scale.py                        # 5,000 then 50,000 JPEGs, 160-256 px
    .venv/bin/python benchmarks/image_scale.py --sizes 1000 10000     # smaller, for a loaded 2-core host

Generates synthetic JPEGs (random sizes in [160, 256] px, a few classes) straight into WebDataset tar
shards in a temporary folder, then, each in a subprocess that reports its own peak RSS:

* validation (``validation.image_suite``: every sample profiled, the GX suite) at each size;
* streamed training input at each size over the same fixed number of steps (``--train-steps`` batches of
  64, ``training.image_stream.ShardStreamSource``, no model, 0 workers), 64 x 64 px: what grows with the
  set is the index and the order, not the steps;

and in this process: the input pipeline's images/s with 0, 1 and 2 DataLoader workers at 128 and 224
px (random resized crop, flip, jitter), against ResNet-18's training consumption (forward + backward,
batch 16, this CPU); and, at 32 px, the decoded-cache path (``cached_pixels`` + in-memory batches)
against the streamed one over the same images as files and as shards.

Last line: ``rss_growth=<validation peak at large / small> train_rss_growth=<...> stream_2w_vs_0w=<...>
cached_vs_stream=<...>``.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from common import ROOT, parser, rounds, table

CLASSES = ["a", "b", "c", "d"]


def _jpeg(rng: np.random.Generator) -> bytes:
    from PIL import Image

    w, h = (int(v) for v in rng.integers(160, 257, 2))
    base = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)  # smooth-ish, photo-sized JPEGs
    img = Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def write_set(folder: Path, n_train: int, n_test: int, per_shard: int = 1000, seed: int = 0) -> None:
    """``folder/{train,test}/NNNNNN.tar``: one encoded JPEG (50 drawn, reused with a unique tail after the
    image's end, so no two samples share a content hash: generating is not what is measured) and its
    class per sample."""
    rng = np.random.default_rng(seed)
    pool = [_jpeg(rng) for _ in range(50)]
    for split, n in (("train", n_train), ("test", n_test)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        for k in range(0, n, per_shard):
            with tarfile.open(folder / split / f"{k // per_shard:06d}.tar", "w") as tar:
                for i in range(k, min(n, k + per_shard)):
                    for name, body in ((f"{i:08d}.jpg", pool[i % 50] + split.encode() + i.to_bytes(4, "little")),
                                       (f"{i:08d}.cls", CLASSES[i % len(CLASSES)].encode())):
                        info = tarfile.TarInfo(name)
                        info.size = len(body)
                        tar.addfile(info, io.BytesIO(body))


def _cfg(path: str, size: int, workers: int):
    from core.config import config_from_dict

    return config_from_dict({
        "name": "scale", "task": "image_classification",
        "dataset": {"path": path, "images": {
            "shards": ".", "size": [size, size], "classes": CLASSES, "workers": workers,
            "augment": {"crop_scale": [0.35, 1.0], "hflip": True, "jitter": 0.2},
            "expectations": {"width": [100, 300], "height": [100, 300], "modes": ["RGB"]}}},
        "model": {"kind": "resnet18"}, "training": {"batch_size": 16}})


CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r})
from pathlib import Path
from image_scale import _cfg
kind, root, path, steps = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
if kind == "validate":
    from validation import image_suite
    cfg = _cfg(path, 64, 0)
    report = image_suite.run({{"dataset": cfg.dataset, "root": root, "seed": 0}}, root / "report")
    out = {{"success": report["success"], "rows": report["rows"]}}
else:
    from training.batches import BatchPlan
    from training.data import load_splits
    cfg = _cfg(path, 64, 0)
    source = load_splits(cfg, root, 0).train
    n = 0
    for i, step in enumerate(source.epoch_steps(0, 0, BatchPlan.of(64, 1, 1))):
        if i == steps:
            break
        n += sum(len(y) for _, y in step.micro)
    out = {{"images": n}}
print(json.dumps({{**out, "seconds": time.perf_counter() - t,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""


def child(kind: str, root: Path, path: str, steps: int = 0) -> dict:
    code = CHILD.format(root=str(ROOT), bench=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-c", code, kind, str(root), path, str(steps)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=7200)
    if done.returncode:
        raise SystemExit(f"{kind} at {path} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def input_rate(root: Path, path: str, size: int, workers: int, images: int) -> float:
    """Images/s the streamed input delivers (decode + augment), batch 16, over about ``images`` images."""
    from training.batches import BatchPlan
    from training.data import load_splits

    source = load_splits(_cfg(path, size, workers), root, 0).train
    n, t = 0, time.perf_counter()
    for step in source.epoch_steps(0, 0, BatchPlan.of(16, 1, 1)):
        n += sum(len(y) for _, y in step.micro)
        if n >= images:
            break
    return n / (time.perf_counter() - t)


def model_rate(size: int, steps: int = 3) -> float:
    """ResNet-18 training images/s on this CPU (forward + backward + SGD step, batch 16)."""
    import torch

    from tasks.image_nets import ResNet18

    model = ResNet18(3, len(CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.rand(16, 3, size, size), torch.randint(0, len(CLASSES), (16,))
    for i in range(steps + 1):
        if i == 1:
            t = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return 16 * steps / (time.perf_counter() - t)


def cached_vs_stream(root: Path, home: Path, n: int) -> tuple[float, float]:
    """Images/s over one epoch at 32 px: the decoded cache (built first, not timed) against the stream."""
    import torch

    from core.config import DatasetConfig
    from tasks.image_options import ImagesConfig
    from tasks.image_data import cached_pixels
    from tasks.image_shards import iter_samples, shard_files
    from training.batches import BatchPlan, InMemorySource
    from torch.utils.data import TensorDataset

    files = root / "files"
    files.mkdir(exist_ok=True)
    paths = []
    for i, (_, data, _) in enumerate(iter_samples(shard_files(root / "data/small/train"), "train")):
        if i == n:
            break
        (files / f"{i}.jpg").write_bytes(data)
        paths.append(f"{i}.jpg")
    ds = DatasetConfig(path="files", images=ImagesConfig(size=(32, 32), classes=CLASSES))
    x = cached_pixels(ds, root, "train", paths, home)
    t = time.perf_counter()
    x = np.array(cached_pixels(ds, root, "train", paths, home))
    source = InMemorySource(TensorDataset(torch.from_numpy(x), torch.zeros(len(x), dtype=torch.int64)), 0)
    count = sum(len(b[1]) for s in source.epoch_steps(0, 0, BatchPlan.of(16, 1, 1)) for b in s.micro)
    cached = count / (time.perf_counter() - t)
    return cached, input_rate(root, "data/small", 32, 0, n)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--sizes", type=int, nargs=2, default=[5000, 50000], metavar=("SMALL", "LARGE"))
    p.add_argument("--rate-images", type=int, default=320, help="images per input-rate measurement")
    p.add_argument("--train-steps", type=int, default=40, help="streamed training steps (batches of 64) per size")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="image-scale-"))
    os.environ["TRAINFLOW_HOME"] = str(tmp / ".trainflow")
    try:
        rows, peaks = [], {}
        for label, n in (("small", args.sizes[0]), ("large", args.sizes[1])):
            t = time.perf_counter()
            write_set(tmp / "data" / label, n, max(100, n // 10))
            gen_s = time.perf_counter() - t
            v, tr = child("validate", tmp, f"data/{label}"), child("train", tmp, f"data/{label}", args.train_steps)
            assert v["success"], v
            peaks[label] = (v["peak_rss_mb"], tr["peak_rss_mb"])
            rows.append([n, f"{gen_s:.0f}", f"{v['peak_rss_mb']:.0f}", f"{v['seconds']:.0f}", f"{tr['peak_rss_mb']:.0f}",
                         f"{tr['seconds']:.0f}", tr["images"]])
            print(f"{label}: n={n} validation {v} train {tr}", flush=True)
        table(["train images", "generate s", "validation peak MB", "validation s", "stream peak MB",
               "stream s", "images streamed"], rows)
        rates = []
        for size in (128, 224):
            model = model_rate(size)
            runs: dict[int, list[float]] = {0: [], 1: [], 2: []}
            for i in range(2):  # alternating order: the shared machine's drift hits each alike
                for w in rounds((0, 1, 2), i):
                    runs[w].append(input_rate(tmp, "data/small", size, w, args.rate_images))
            got = {w: statistics.median(v) for w, v in runs.items()}
            rates.append((size, model, got))
            print(f"{size} px: model {model:.1f} img/s, input " + ", ".join(f"{w}w {r:.1f}" for w, r in got.items()),
                  flush=True)
        table(["px", "ResNet-18 consumes img/s", "input 0 workers", "input 1 worker", "input 2 workers"],
              [[s, f"{m:.1f}", *(f"{g[w]:.1f}" for w in (0, 1, 2))] for s, m, g in rates])
        cached, streamed = cached_vs_stream(tmp, tmp / ".trainflow", min(args.sizes[0], 2000))
        print(f"32 px, one epoch's input: cached {cached:.0f} img/s, streamed (0 workers) {streamed:.0f} img/s")
        growth = peaks["large"][0] / peaks["small"][0]
        train_growth = peaks["large"][1] / peaks["small"][1]
        two_vs_zero = rates[0][2][2] / rates[0][2][0]
        print(f"rss_growth={growth:.2f} train_rss_growth={train_growth:.2f} stream_2w_vs_0w={two_vs_zero:.2f} "
              f"cached_vs_stream={cached / streamed:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
