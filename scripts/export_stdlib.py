"""Export the running interpreter's standard-library sources as the DVC-tracked text corpus.

    python scripts/export_stdlib.py            # (re)write data-stdlib/{train,val}.jsonl + manifest.json
    python scripts/export_stdlib.py --check    # export to a temp dir, prove the hash equals data-stdlib.dvc

The rule: the ``*.py`` files directly in the stdlib folder (no sub-packages), not starting with
``_``, of ``MIN_BYTES`` to ``MAX_BYTES``, decoding as UTF-8, sorted by path; a file is ``val`` when
sha256(its path)'s first 8 hex digits modulo 100 are below ``VAL_PERCENT`` (stable when files come
or go). Each split is JSON Lines ``{"path", "text"}``; ``manifest.json`` records the Python version
and the rule. The stdlib differs between Python versions, so ``--check`` holds only on the recorded
one, and says so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import sysconfig
from pathlib import Path

from core.hashing import check_export, dvc_dir_md5

ROOT = Path(__file__).resolve().parents[1]
DVC_FILE = "data-stdlib.dvc"
FOLDER = "data-stdlib"
MIN_BYTES = 2_000
MAX_BYTES = 16_000
VAL_PERCENT = 20
SPLITS = ("train", "val")


def python_version() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def split_of(relpath: str, val_percent: int = VAL_PERCENT) -> str:
    """``val`` or ``train``, from the sha256 of the path alone."""
    bucket = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % 100
    return "val" if bucket < val_percent else "train"


def select(stdlib: Path) -> list[tuple[str, str]]:
    """``[(relative path, text)]`` of the files the rule keeps, sorted by path."""
    out = []
    for path in sorted(Path(stdlib).glob("*.py")):
        raw = path.read_bytes() if path.is_file() and not path.name.startswith("_") else b""
        if MIN_BYTES <= len(raw) <= MAX_BYTES:
            try:
                out.append((path.name, raw.decode("utf-8")))
            except UnicodeDecodeError:
                pass
    return out


def export(dest: Path, stdlib: Path | None = None) -> dict[str, Path]:
    """Write ``dest/data-stdlib/{train,val}.jsonl`` and ``manifest.json``; returns the paths."""
    out = Path(dest) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    files = {s: out / f"{s}.jsonl" for s in SPLITS}
    lines: dict[str, list[str]] = {s: [] for s in SPLITS}
    for rel, text in select(Path(stdlib or sysconfig.get_paths()["stdlib"])):
        lines[split_of(rel)].append(json.dumps({"path": rel, "text": text}, ensure_ascii=False, sort_keys=True))
    for s in SPLITS:
        files[s].write_bytes("".join(line + "\n" for line in lines[s]).encode("utf-8"))
    manifest = {
        "python": python_version(),
        "source": "sysconfig.get_paths()['stdlib'], top-level *.py",
        "rule": {"min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES, "skip_prefix": "_",
                 "val_percent": VAL_PERCENT, "split_by": "sha256(path)[:8] % 100"},
        "documents": {s: len(lines[s]) for s in SPLITS},
    }
    files["manifest"] = out / "manifest.json"
    files["manifest"].write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return files


def recorded_python(root: Path) -> str | None:
    """The Python version the workspace's export came from (None when the data is not pulled)."""
    try:
        return json.loads((root / FOLDER / "manifest.json").read_text())["python"]
    except (OSError, ValueError, KeyError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help=f"export to a temp dir and compare with {DVC_FILE}")
    ap.add_argument("--dest", type=Path, default=ROOT)
    ap.add_argument("--stdlib", type=Path, default=None, help="a stdlib folder (default: this interpreter's)")
    args = ap.parse_args(argv)
    if not args.check:
        files = export(args.dest, args.stdlib)
        print(f"wrote {files['train'].parent} ({dvc_dir_md5(files['train'].parent)}) from {python_version()}")
        return 0
    if check_export(ROOT, DVC_FILE, lambda tmp: export(tmp, args.stdlib)["train"].parent) == 0:
        return 0
    source = recorded_python(ROOT)
    if source is None:
        print(f"The recorded export's Python version is unknown here (run `dvc pull` to get "
              f"{FOLDER}/manifest.json); this interpreter is {python_version()}.", file=sys.stderr)
    elif source != python_version():
        print(f"The recorded corpus was exported from {source}, this interpreter is {python_version()}: "
              "the standard library differs between Python versions, so the export cannot match. "
              f"Run --check with {source}.", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
