"""Export scikit-learn's UCI handwritten digits as the bundled, DVC-tracked dataset.

    python scripts/export_digits.py            # (re)write data/digits/{train,test}.csv
    python scripts/export_digits.py --check    # export to a temp dir, prove the hash equals data/digits.dvc

Byte-stable: a fixed stratified split from a seed, integer pixels written by hand (no float
formatting, no library-version metadata).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from core.hashing import check_export, dvc_dir_md5

ROOT = Path(__file__).resolve().parents[1]
SEED = 20261129
TEST_FRACTION = 0.2
N_PIXELS = 64
DVC_FILE = "data/digits.dvc"


def split_indices(labels: np.ndarray, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Stratified split: within each class, a seeded permutation sends round(n*f) rows to test."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        idx = np.flatnonzero(labels == cls)
        idx = idx[rng.permutation(len(idx))]
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def write_csv(path: Path, pixels: np.ndarray, labels: np.ndarray) -> None:
    header = ",".join([*(f"pixel_{i}" for i in range(N_PIXELS)), "label"])
    rows = [",".join(str(int(v)) for v in (*p, y)) for p, y in zip(pixels, labels)]
    path.write_bytes(("\n".join([header, *rows]) + "\n").encode("ascii"))


def export(dest: Path) -> Path:
    """Write ``dest/digits/{train,test}.csv``; returns that folder."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = digits.data.astype(np.int64)
    labels = digits.target.astype(np.int64)
    out = dest / "digits"
    out.mkdir(parents=True, exist_ok=True)
    for split, idx in zip(("train", "test"), split_indices(labels, SEED, TEST_FRACTION)):
        write_csv(out / f"{split}.csv", pixels[idx], labels[idx])
    return out


def export_main(doc: str, dvc_file: str, export, argv: list[str] | None = None) -> int:
    """The CLI of a bundled dataset's export: ``export(dest)`` writes it and returns its folder;
    ``--check`` compares a fresh export's DVC hash with ``dvc_file``'s."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"export to a temp dir and compare with {dvc_file}")
    ap.add_argument("--dest", type=Path, default=ROOT / "data")
    args = ap.parse_args(argv)
    if args.check:
        return check_export(ROOT, dvc_file, export)
    out = export(args.dest)
    print(f"wrote {out} ({dvc_dir_md5(out)})")
    return 0


if __name__ == "__main__":
    sys.exit(export_main(__doc__, DVC_FILE, export))
