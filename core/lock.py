"""The hash-pinned lock files and whether they still match ``pyproject.toml``.

``requirements/lock.txt`` (CUDA torch from PyPI, what the GPU image installs) and
``requirements/lock-cpu.txt`` (torch's CPU build) are written by ``make lock``
(``scripts/lock.py``) in pip-compile's format: ``name==version`` followed by
``--hash=sha256:...`` lines, installable with ``pip install --require-hashes``.
Each starts with a header naming the sha256 of the dependency lists it was
resolved from; :func:`check_lock` compares that with the current
``pyproject.toml`` and also checks every top-level requirement is pinned inside
its range, so an edit to the dependencies without ``make lock`` is caught.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HEADER_KEY = "pyproject-sha256"
LOCK_FILES = {"cuda": "requirements/lock.txt", "cpu": "requirements/lock-cpu.txt"}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_inputs(pyproject: dict) -> dict:
    """What a lock is resolved from: requires-python and the runtime dependencies, normalised."""
    from packaging.requirements import Requirement

    project = pyproject["project"]
    deps = sorted(str(Requirement(d)) for d in project.get("dependencies", []))
    return {"requires-python": project.get("requires-python", ""), "dependencies": deps}


def inputs_sha256(pyproject_path: Path) -> str:
    """sha256 of :func:`locked_inputs` as canonical JSON: the value recorded in a lock's header."""
    data = tomllib.loads(Path(pyproject_path).read_text())
    blob = json.dumps(locked_inputs(data), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class LockFile:
    path: Path
    header: dict[str, str] = field(default_factory=dict)
    pins: dict[str, str] = field(default_factory=dict)          # canonical name -> version
    hashes: dict[str, list[str]] = field(default_factory=dict)  # canonical name -> sha256:...
    duplicates: list[str] = field(default_factory=list)


def parse_lock(path: Path) -> LockFile:
    """Read a lock file: its ``# key: value`` header lines, pins and hashes."""
    lock = LockFile(Path(path))
    current: str | None = None
    for raw in Path(path).read_text().splitlines():
        line = raw.strip()
        if line.startswith("#"):
            key, sep, value = line.lstrip("# ").partition(":")
            if sep and key and " " not in key:
                lock.header.setdefault(key, value.strip())
            continue
        if not line:
            continue
        if m := _PIN.match(line):
            current = _canonical(m.group(1))
            if current in lock.pins:
                lock.duplicates.append(current)
            lock.pins[current] = m.group(2)
            lock.hashes.setdefault(current, [])
        if current is not None:
            lock.hashes[current].extend(_HASH.findall(line))
    return lock


def check_lock(pyproject_path: Path, lock_path: Path) -> list[str]:
    """Every way ``lock_path`` disagrees with ``pyproject_path``; empty when in sync.

    Checked: the header's input hash equals the current one, each top-level
    dependency is pinned to a version inside its specifier, every pin carries at
    least one sha256 hash, and no package is pinned twice.
    """
    from packaging.requirements import Requirement

    lock_path, pyproject_path = Path(lock_path), Path(pyproject_path)
    if not lock_path.is_file():
        return [f"{lock_path}: missing; run `make lock`"]
    lock = parse_lock(lock_path)
    problems: list[str] = []
    want = inputs_sha256(pyproject_path)
    got = lock.header.get(HEADER_KEY)
    if got != want:
        problems.append(f"{lock_path}: {HEADER_KEY} is {got or 'absent'}, {pyproject_path.name}'s "
                        f"dependencies hash to {want}: the dependencies changed since the lock was made")
    deps = tomllib.loads(pyproject_path.read_text())["project"].get("dependencies", [])
    for dep in deps:
        req = Requirement(dep)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = _canonical(req.name)
        pinned = lock.pins.get(name)
        if pinned is None:
            problems.append(f"{lock_path}: {req.name} (required as '{dep}') is not pinned")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{lock_path}: {req.name}=={pinned} is outside '{dep}'")
    for name, hashes in lock.hashes.items():
        if not hashes:
            problems.append(f"{lock_path}: {name}=={lock.pins[name]} has no --hash")
    for name in lock.duplicates:
        problems.append(f"{lock_path}: {name} is pinned more than once")
    if problems:
        problems.append("regenerate with `make lock` (scripts/lock.py) and commit requirements/")
    return problems
