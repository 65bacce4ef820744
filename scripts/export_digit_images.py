"""Export scikit-learn's UCI handwritten digits as a bundled image folder, DVC-tracked.

    python scripts/export_digit_images.py          # (re)write data/digit-images/{train,test}/<digit>/NNNN.png
    python scripts/export_digit_images.py --check  # export to a temp dir, prove the hash equals data/digit-images.dvc

The table's digits and split (``export_digits``) as grey PNGs in class folders (ImageFolder
layout), 0..16 scaled to 0..255. Byte-stable: a fixed compression level, no metadata chunks (the
bytes also depend on zlib's version, which ``--check`` would show).
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

from core.hashing import check_export, dvc_dir_md5

ROOT = Path(__file__).resolve().parents[1]
DVC_FILE = "data/digit-images.dvc"
NAME = "digit-images"


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG", compress_level=9)
    return out.getvalue()


def export(dest: Path) -> Path:
    from sklearn.datasets import load_digits

    sys.path.insert(0, str(ROOT / "scripts"))
    from export_digits import SEED, TEST_FRACTION, split_indices

    digits = load_digits()
    labels = digits.target.astype(np.int64)
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    train_idx, test_idx = split_indices(labels, SEED, TEST_FRACTION)
    out = dest / NAME
    for split, idx in (("train", train_idx), ("test", test_idx)):
        for i in idx:
            path = out / split / str(labels[i]) / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png(images[i]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"export to a temp dir and compare with {DVC_FILE}")
    ap.add_argument("--dest", type=Path, default=ROOT / "data")
    args = ap.parse_args(argv)
    if not args.check:
        out = export(args.dest)
        print(f"wrote {out} ({dvc_dir_md5(out)})")
        return 0
    return check_export(ROOT, DVC_FILE, export)

if __name__ == "__main__":
    sys.exit(main())
