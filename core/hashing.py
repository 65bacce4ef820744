"""Canonical hashing used for config ids, manifests and file digests."""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def sha256_json(obj: Any) -> str:
    """sha256 of canonical JSON (sorted keys, no whitespace): the same data always hashes the same."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_id(path: str | Path) -> tuple:
    """A file's identity for the caches: its path, size and modification time (None if missing)."""
    try:
        st = Path(path).stat()
    except OSError:
        return (str(path), None)
    return (str(path), st.st_size, st.st_mtime_ns)


def dvc_dir_md5(folder: Path) -> str:
    """DVC 3's hash of a tracked directory (the ``md5`` in its .dvc file), computed without DVC."""
    entries = sorted(({"md5": hashlib.md5(p.read_bytes()).hexdigest(), "relpath": p.relative_to(folder).as_posix()}
                      for p in Path(folder).rglob("*") if p.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def check_export(root: Path, dvc_file: str, export_into) -> int:
    """A bundled dataset's ``--check``: ``export_into(folder)`` writes a fresh export into a temporary
    folder and returns the exported dataset's folder; 0 (and OK) when its DVC hash equals
    ``outs[0].md5`` of ``root/dvc_file``, else 1 (and MISMATCH on stderr)."""
    import yaml

    recorded = yaml.safe_load((Path(root) / dvc_file).read_text())["outs"][0]["md5"]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = dvc_dir_md5(export_into(Path(tmp)))
    if fresh != recorded:
        print(f"MISMATCH: fresh export {fresh} != {dvc_file} {recorded}", file=sys.stderr)
        return 1
    print(f"OK: fresh export hashes to {fresh}, as recorded in {dvc_file}")
    return 0
