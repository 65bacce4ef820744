"""Export scikit-learn's wine recognition data as the bundled wine example: one CSV to bring.

    python scripts/export_wine.py            # (re)write data/wine/wine.csv
    python scripts/export_wine.py --out data/mywine/wine.csv   # the same table anywhere else
    python scripts/export_wine.py --check    # export to a temp dir, prove the hash equals data/wine.dvc

178 wines, 13 named measurements and ``target``, the cultivar as a string: a table as a user
would bring it, one file, not split. Byte-stable: rows in scikit-learn's order, each number
written with ``repr``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
DVC_FILE = "data/wine.dvc"


def export(dest: Path, path: Path | None = None) -> Path:
    """Write ``dest/wine/wine.csv`` (or ``path``); returns its path."""
    from sklearn.datasets import load_wine

    wine = load_wine()
    names = [str(n) for n in wine.target_names]
    header = ",".join([*wine.feature_names, "target"])
    rows = [",".join([*(repr(float(v)) for v in x), names[int(y)]]) for x, y in zip(wine.data, wine.target)]
    path = path or dest / "wine" / "wine.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\n".join([header, *rows]) + "\n").encode("ascii"))
    return path


def main(argv: list[str] | None = None) -> int:
    from core.hashing import check_export, dvc_dir_md5

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"export to a temp dir and compare with {DVC_FILE}")
    ap.add_argument("--dest", type=Path, default=ROOT / "data")
    ap.add_argument("--out", type=Path, help="write the table to this file instead of DEST/wine/wine.csv")
    args = ap.parse_args(argv)
    if not args.check:
        path = export(args.dest, args.out)
        print(f"wrote {path} (md5 {hashlib.md5(path.read_bytes()).hexdigest()}; folder {dvc_dir_md5(path.parent)})")
        return 0
    return check_export(ROOT, DVC_FILE, lambda tmp: export(tmp).parent)

if __name__ == "__main__":
    sys.exit(main())
