"""Export scikit-learn's UCI handwritten digits as a bundled image folder, DVC-tracked.

    python scripts/export_digit_images.py          # (re)write data/digit-images/{train,test}/<digit>/NNNN.png
    python scripts/export_digit_images.py --check  # export to a temp dir, prove the hash equals data/digit-images.dvc

The table's digits and split (``export_digits``) as grey PNGs in class folders (ImageFolder
layout), 0..16 scaled to 0..255. Byte-stable: a fixed compression level, no metadata chunks (the
bytes also depend on zlib's version, which ``--check`` would show).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_digits import SEED, TEST_FRACTION, export_main, split_indices  # noqa: E402

DVC_FILE = "data/digit-images.dvc"
NAME = "digit-images"


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG", compress_level=9)
    return out.getvalue()


def export(dest: Path) -> Path:
    from sklearn.datasets import load_digits

    digits = load_digits()
    labels = digits.target.astype(np.int64)
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)
    out = dest / NAME
    for split, idx in zip(("train", "test"), split_indices(labels, SEED, TEST_FRACTION)):
        for i in idx:
            path = out / split / str(labels[i]) / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png(images[i]))
    return out


if __name__ == "__main__":
    sys.exit(export_main(__doc__, DVC_FILE, export))
