"""Fail (exit 1) when requirements/lock*.txt no longer match pyproject.toml: ``make check-lock``.

Offline: each lock's header hash against pyproject.toml's, every top-level dependency pinned
inside its range with hashes (the dev lock for the dev and team extras), and each runtime lock with
the dev lock closed on every CPython 3.11 release (core.lock.PYTHONS), read from the installed
packages' metadata.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lock import (  # noqa: E402
    DEV_LOCK, LOCK_FILES, PYTHONS, check_dev_lock, check_lock, closure_problems, installed_metadata, parse_lock,
)


def main() -> int:
    pyproject = ROOT / "pyproject.toml"
    problems = [p for rel in LOCK_FILES.values() for p in check_lock(pyproject, ROOT / rel)]
    problems += [p for rel in LOCK_FILES.values() for p in check_dev_lock(pyproject, ROOT / DEV_LOCK, ROOT / rel)]
    metadata, dev = installed_metadata(), parse_lock(ROOT / DEV_LOCK)
    for rel in LOCK_FILES.values():
        problems += closure_problems([parse_lock(ROOT / rel), dev], PYTHONS, metadata)[0]
    for p in dict.fromkeys(problems):
        print(f"check_lock: {p}", file=sys.stderr)
    if not problems:
        print("check_lock: " + ", ".join([*LOCK_FILES.values(), DEV_LOCK]) + " match pyproject.toml and hold on CPython "
              f"{PYTHONS[0]} to {PYTHONS[-1]}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
