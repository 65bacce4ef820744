"""Fail (exit 1) when requirements/lock*.txt no longer match pyproject.toml: ``make check-lock``.

Offline: compares the dependency hash in each lock's header with pyproject.toml's
and checks every top-level dependency is pinned inside its range, with hashes;
the dev lock the same for the dev and team extras, on top of each runtime lock.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lock import DEV_LOCK, LOCK_FILES, check_dev_lock, check_lock  # noqa: E402


def main() -> int:
    pyproject = ROOT / "pyproject.toml"
    problems = [p for rel in LOCK_FILES.values() for p in check_lock(pyproject, ROOT / rel)]
    problems += [p for rel in LOCK_FILES.values() for p in check_dev_lock(pyproject, ROOT / DEV_LOCK, ROOT / rel)]
    for p in dict.fromkeys(problems):
        print(f"check_lock: {p}", file=sys.stderr)
    if not problems:
        print("check_lock: " + ", ".join([*LOCK_FILES.values(), DEV_LOCK]) + " match pyproject.toml")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
