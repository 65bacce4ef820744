"""The hash-pinned lock files (``make lock`` writes them in pip-compile's format) and whether they
still match ``pyproject.toml``: each header names the sha256 of the dependency lists it was
resolved from. A lock holds for every CPython 3.11 patch release (:data:`PYTHONS`): a package only
some releases need (redis needs ``async-timeout`` below 3.11.3, Debian bookworm's is 3.11.2) is
pinned with its marker.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from core.hashing import sha256_json

HEADER_KEY = "pyproject-sha256"
LOCK_FILES = {"cuda": "requirements/lock.txt", "cpu": "requirements/lock-cpu.txt"}
DEV_LOCK = "requirements/lock-dev.txt"
DEV_EXTRAS = ("dev", "team")  # what `make install` and CI add to the runtime lock

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)(?:\s*;\s*(.+?))?(?=\s+--hash|\s*\\?$)")
# The interpreters a lock must hold for: every CPython 3.11 patch release up to the newest
# (3.11.14), Debian bookworm's 3.11.2 among them. Markers are evaluated for Linux x86_64.
PYTHONS = tuple(f"3.11.{n}" for n in range(15))
LOCK_PLATFORM = {"implementation_name": "cpython", "platform_python_implementation": "CPython",
                 "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
                 "os_name": "posix", "python_version": "3.11"}
_HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_inputs(pyproject: dict, extras: tuple[str, ...] = ()) -> dict:
    """What a lock is resolved from: requires-python and the runtime dependencies (plus the
    requirements of ``extras``, for the dev lock), normalised."""
    from packaging.requirements import Requirement

    project = pyproject["project"]
    deps = sorted(str(Requirement(d)) for d in project.get("dependencies", []))
    inputs = {"requires-python": project.get("requires-python", ""), "dependencies": deps}
    if extras:
        optional = project.get("optional-dependencies", {})
        inputs["extras"] = {e: sorted(str(Requirement(d)) for d in optional.get(e, [])) for e in extras}
    return inputs


def inputs_sha256(pyproject_path: Path, extras: tuple[str, ...] = ()) -> str:
    """sha256 of :func:`locked_inputs` as canonical JSON: the value recorded in a lock's header."""
    return sha256_json(locked_inputs(tomllib.loads(Path(pyproject_path).read_text()), extras))


def extra_requirements(pyproject_path: Path, extras: tuple[str, ...] = DEV_EXTRAS) -> list[str]:
    """The requirement strings of ``extras`` in ``pyproject_path``, in file order."""
    optional = tomllib.loads(Path(pyproject_path).read_text())["project"].get("optional-dependencies", {})
    return [d for e in extras for d in optional.get(e, [])]


@dataclass
class LockFile:
    path: Path
    header: dict[str, str] = field(default_factory=dict)
    pins: dict[str, str] = field(default_factory=dict)          # canonical name -> version
    hashes: dict[str, list[str]] = field(default_factory=dict)  # canonical name -> sha256:...
    markers: dict[str, str] = field(default_factory=dict)       # canonical name -> environment marker
    duplicates: list[str] = field(default_factory=list)

    def pins_for(self, python_full_version: str) -> dict[str, str]:
        """The pins an install on that CPython 3.11 release takes (markers evaluated)."""
        return {name: v for name, v in self.pins.items()
                if name not in self.markers or marker_holds(self.markers[name], python_full_version)}


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
            if m.group(3):
                lock.markers[current] = m.group(3).strip()
            lock.hashes.setdefault(current, [])
        if current is not None:
            lock.hashes[current].extend(_HASH.findall(line))
    return lock


def check_lock(pyproject_path: Path, lock_path: Path) -> list[str]:
    """Every way ``lock_path`` disagrees with ``pyproject_path`` (header hash, each dependency pinned
    inside its range, every pin hashed, none pinned twice); empty when in sync."""
    lock_path, pyproject_path = Path(lock_path), Path(pyproject_path)
    if not lock_path.is_file():
        return [f"{lock_path}: missing; run `make lock`"]
    lock = parse_lock(lock_path)
    deps = tomllib.loads(pyproject_path.read_text())["project"].get("dependencies", [])
    return _regenerate(_header_problems(lock, pyproject_path, ()) + _pin_problems(lock_path, deps, lock.pins)
                       + _hash_problems(lock))


def check_dev_lock(pyproject_path: Path, dev_lock_path: Path, base_lock_path: Path) -> list[str]:
    """Every way the dev lock disagrees with ``pyproject_path``'s dev extras; empty when in sync. It
    only adds to ``base_lock_path``: none of its pins may repin a package of the base (installed
    together with ``--no-deps``, they must not fight over a version)."""
    dev_lock_path, pyproject_path = Path(dev_lock_path), Path(pyproject_path)
    if not dev_lock_path.is_file():
        return [f"{dev_lock_path}: missing; run `make lock`"]
    dev, base = parse_lock(dev_lock_path), parse_lock(base_lock_path)
    problems = (_header_problems(dev, pyproject_path, DEV_EXTRAS)
                + _pin_problems(dev_lock_path, extra_requirements(pyproject_path), {**base.pins, **dev.pins})
                + _hash_problems(dev))
    problems += [f"{dev_lock_path}: {name}=={dev.pins[name]} repins {base_lock_path.name}'s {name}=={base.pins[name]}"
                 for name in sorted(set(dev.pins) & set(base.pins))]
    return _regenerate(problems)


def _regenerate(problems: list[str]) -> list[str]:
    return [*problems, "regenerate with `make lock` (scripts/lock.py) and commit requirements/"] if problems else []


def _header_problems(lock: LockFile, pyproject_path: Path, extras: tuple[str, ...]) -> list[str]:
    want = inputs_sha256(pyproject_path, extras)
    got = lock.header.get(HEADER_KEY)
    if got == want:
        return []
    what = "dependencies" + (f" and extras {', '.join(extras)}" if extras else "")
    return [f"{lock.path}: {HEADER_KEY} is {got or 'absent'}, {pyproject_path.name}'s {what} hash to "
            f"{want}: the dependencies changed since the lock was made"]


def _pin_problems(lock_path: Path, requirements: list[str], pins: dict[str, str]) -> list[str]:
    from packaging.requirements import Requirement

    problems = []
    for dep in requirements:
        req = Requirement(dep)
        if req.marker is not None and not req.marker.evaluate():
            continue
        pinned = pins.get(_canonical(req.name))
        if pinned is None:
            problems.append(f"{lock_path}: {req.name} (required as '{dep}') is not pinned")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{lock_path}: {req.name}=={pinned} is outside '{dep}'")
    return problems


def _hash_problems(lock: LockFile) -> list[str]:
    problems = [f"{lock.path}: {name}=={lock.pins[name]} has no --hash" for name, h in lock.hashes.items() if not h]
    return problems + [f"{lock.path}: {name} is pinned more than once" for name in lock.duplicates]


def marker_env(python_full_version: str) -> dict[str, str]:
    """The marker environment of the lock's platform on one CPython release."""
    return {**LOCK_PLATFORM, "python_full_version": python_full_version, "extra": ""}


def marker_holds(marker: str, python_full_version: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker).evaluate(marker_env(python_full_version))


def installed_metadata() -> dict[str, tuple[str, str | None, list[str]]]:
    """canonical name -> (version, Requires-Python, Requires-Dist) of this environment's distributions."""
    from importlib.metadata import distributions

    out = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(_canonical(name), (dist.version, dist.metadata.get("Requires-Python"), dist.requires or []))
    return out


def closure_problems(locks: list[LockFile], pythons: tuple[str, ...],
                     metadata: dict[str, tuple[str, str | None, list[str]]]) -> tuple[list[str], int]:
    """Whether ``locks`` (installed together) hold on each CPython release in ``pythons``: every pin a
    release takes accepts it (Requires-Python) and finds each of its requirements pinned inside its
    range, read from ``metadata`` (a pin whose installed version differs is not checked).
    Returns (problems, how many pins were checked, summed over the releases)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    where = " or ".join(lock.path.name for lock in locks)
    parsed: dict[str, list[tuple[str, Requirement]]] = {}  # each package's requirements, parsed once
    problems, checked = [], 0
    for python in pythons:
        env = marker_env(python)
        pins: dict[str, str] = {}
        for lock in locks:
            pins.update(lock.pins_for(python))
        for name, version in sorted(pins.items()):
            if name not in metadata or metadata[name][0] != version:
                continue
            checked += 1
            _, requires_python, requires = metadata[name]
            if requires_python and not SpecifierSet(requires_python).contains(python, prereleases=True):
                problems.append(f"{where}: {name}=={version} requires Python {requires_python!r}, not {python}")
            if name not in parsed:
                parsed[name] = [(text, Requirement(text)) for text in requires]
            for text, req in parsed[name]:
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
                pinned = pins.get(_canonical(req.name))
                if pinned is None:
                    problems.append(f"{where}: {name}=={version} requires {text!r} on CPython {python}, "
                                    f"which is not pinned for it")
                elif not req.specifier.contains(pinned, prereleases=True):
                    problems.append(f"{where}: {name}=={version} requires {text!r}, pinned {pinned}")
    return problems, checked
