"""Write the hash-pinned lock files from pyproject.toml: ``make lock``.

    python scripts/lock.py            # every variant
    python scripts/lock.py --variant cpu

``pip lock`` (pip >= 25.1, PEP 751, ``--use-feature=fast-deps``: metadata by HTTP range requests,
no wheel downloaded) resolves for Linux x86_64 / CPython 3.11, the Dockerfile's platform; the
result is written in pip-compile's format (``name==version --hash=sha256:...``). What each lock
holds and why each variant is resolved again on an older 3.11: docs/image.md, "The lock". Pip's
own configuration is ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lock import (  # noqa: E402
    DEV_EXTRAS, DEV_LOCK, HEADER_KEY, LOCK_FILES, _canonical, extra_requirements, inputs_sha256, marker_holds,
    parse_lock,
)

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PLATFORM = "linux x86_64, CPython 3.11 (every 3.11.x: packages only some releases need carry their markers)"
PYTHON_ALSO = "/usr/bin/python3.11"  # Debian bookworm's CPython 3.11.2
INSTALL = {
    "cuda": "pip install --require-hashes --no-deps -r requirements/lock.txt",
    "cpu": f"pip install --require-hashes --no-deps --extra-index-url {TORCH_CPU_INDEX} -r requirements/lock-cpu.txt",
    "dev": f"pip install --require-hashes --no-deps -r {DEV_LOCK}  (after lock.txt or lock-cpu.txt)",
}
VARIANTS = [*sorted(LOCK_FILES), "dev"]  # dev last: it is resolved against lock-cpu.txt's pins


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _torch_pin(deps: list[str]) -> str:
    from packaging.requirements import Requirement

    for dep in deps:
        req = Requirement(dep)
        if req.name.lower() == "torch":
            spec = [s for s in req.specifier if s.operator == "=="]
            if not spec:
                sys.exit("scripts/lock.py: torch must be pinned with == in pyproject.toml (the CPU lock adds +cpu)")
            return spec[0].version
    sys.exit("scripts/lock.py: torch is not a dependency in pyproject.toml")


def _index_args(variant: str, deps: list[str], index_url: str | None, cpu_wheels: str | None) -> list[str]:
    """The package sources: ``index_url`` (default PyPI), and torch's +cpu wheel for cpu and dev from a
    local folder holding it, else the PyTorch CPU index."""
    args = ["--index-url", index_url] if index_url else []
    if variant in ("cpu", "dev"):
        version = _torch_pin(deps)
        wheels = next((c for c in (cpu_wheels, os.environ.get("TRAINFLOW_TORCH_CPU_WHEELS"), "/opt/wheels")
                       if c and any(Path(c).glob(f"torch-{version}+cpu-cp311-*.whl"))), None)
        args += ["--find-links", str(Path(wheels))] if wheels else ["--extra-index-url", TORCH_CPU_INDEX]
    return args


def pip_lock(variant: str, deps: list[str], index_url: str | None, cpu_wheels: str | None, work: Path,
             pins: dict[str, str] | None = None) -> Path:
    """Run ``pip lock`` for one variant; return the pylock.toml it wrote. ``pins`` (the dev variant):
    name -> version every runtime package is held at."""
    reqs = work / f"requirements-{variant}.in"
    reqs.write_text("\n".join(deps) + "\n")
    out = work / f"pylock-{variant}.toml"
    cmd = [sys.executable, "-m", "pip", "lock", "--use-feature=fast-deps", "-q", "-r", str(reqs), "-o", str(out),
           *_index_args(variant, deps, index_url, cpu_wheels)]
    held = {**(pins or {}), **({"torch": f"{_torch_pin(deps)}+cpu"} if variant in ("cpu", "dev") else {})}
    if held:
        cons = work / f"constraints-{variant}.txt"
        cons.write_text("".join(f"{name}=={v}\n" for name, v in sorted(held.items())))
        cmd += ["-c", str(cons)]
    subprocess.run(cmd, check=True, env=_pip_env(), cwd=work)
    return out


def conditional_packages(variant: str, deps: list[str], pins: dict[str, str], python: str,
                         index_url: str | None, cpu_wheels: str | None, work: Path) -> list[dict]:
    """What ``python`` (another CPython 3.11 release) needs on top of ``pins`` (name -> version, the
    first resolution), each as {name, version, marker, hashes}; the marker is the one its
    requirers declare, so installs on other releases skip it."""
    from packaging.requirements import Requirement

    reqs = work / f"requirements-{variant}-also.in"
    reqs.write_text("\n".join(deps) + "\n")
    cons = work / f"constraints-{variant}-also.txt"
    cons.write_text("".join(f"{name}=={v}\n" for name, v in sorted(pins.items())))
    report = work / f"report-{variant}-also.json"
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--ignore-installed", "-q",
           "--report", str(report), "-r", str(reqs), "-c", str(cons), *_index_args(variant, deps, index_url, cpu_wheels)]
    subprocess.run(cmd, check=True, env=_pip_env(), cwd=work)
    items = json.loads(report.read_text())["install"]
    requirers = [*deps, *(r for item in items for r in item["metadata"].get("requires_dist", []))]
    here = platform.python_version()
    out = []
    for item in items:
        name = _canonical(item["metadata"]["name"])
        if name in pins:
            continue
        markers = sorted({str(Requirement(r).marker) for r in requirers
                          if _canonical(Requirement(r).name) == name and Requirement(r).marker is not None})
        if not markers or any("extra" in m for m in markers) or any(marker_holds(m, here) for m in markers):
            raise SystemExit(f"scripts/lock.py: {name} is needed on {python} but no Python marker of its "
                             f"requirers ({markers or 'none'}) leaves it out on {here}: lock it by hand")
        marker = markers[0] if len(markers) == 1 else " or ".join(f"({m})" for m in markers)
        hashes = item["download_info"].get("archive_info", {}).get("hashes", {})
        if "sha256" not in hashes:
            raise SystemExit(f"scripts/lock.py: {name} on {python} came without a sha256")
        out.append({"name": item["metadata"]["name"], "version": item["metadata"]["version"], "marker": marker,
                    "hashes": [hashes["sha256"]]})
    return out


def pylock_packages(pylock: Path) -> list[dict]:
    """pylock.toml's packages as {name, version, marker (None), hashes}."""
    out = []
    for pkg in tomllib.loads(pylock.read_text())["packages"]:
        if "version" not in pkg:
            raise SystemExit(f"scripts/lock.py: {pkg['name']} resolved to a non-index source {pkg}")
        files = [*pkg.get("wheels", []), *([pkg["sdist"]] if "sdist" in pkg else [])]
        out.append({"name": pkg["name"], "version": pkg["version"], "marker": None,
                    "hashes": sorted({f["hashes"]["sha256"] for f in files})})
    return out


def lock_packages(path: Path) -> list[dict]:
    """A committed lock's unconditional pins in the same shape (``--keep-pins``)."""
    lock = parse_lock(path)
    names = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith((" ", "#")) and "==" in line:
            names[_canonical(line.split("==", 1)[0])] = line.split("==", 1)[0]
    return [{"name": names[n], "version": v, "marker": None, "hashes": [h.split(":", 1)[1] for h in lock.hashes[n]]}
            for n, v in lock.pins.items() if n not in lock.markers]


def to_requirements(packages: list[dict], variant: str, digest: str, leave_out: frozenset[str] = frozenset()) -> str:
    """Packages -> pip-compile style text with a header that records the input hash (a package with a
    marker: ``name==version ; marker``); ``leave_out``: canonical names another lock pins already."""
    lines = [
        "# trainflow lock file: generated by `make lock` (scripts/lock.py) from pyproject.toml; do not edit.",
        f"# {HEADER_KEY}: {digest}",
        f"# variant: {variant}",
        f"# platform: {PLATFORM}",
        f"# install: {INSTALL[variant]}",
        "",
    ]
    for pkg in sorted(packages, key=lambda p: p["name"].lower()):
        if _canonical(pkg["name"]) in leave_out:
            continue
        hashes = pkg["hashes"]
        if not hashes:
            raise SystemExit(f"scripts/lock.py: {pkg['name']}=={pkg['version']} came without a sha256")
        marker = f" ; {pkg['marker']}" if pkg["marker"] else ""
        lines.append(f"{pkg['name']}=={pkg['version']}{marker} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS, action="append",
                    help="which lock to write (default: all)")
    ap.add_argument("--index-url", help="package index (default: PyPI)")
    ap.add_argument("--torch-cpu-wheels", help="folder holding torch's +cpu wheel, instead of the PyTorch CPU index")
    ap.add_argument("--python-also", default=PYTHON_ALSO,
                    help=f"an older CPython 3.11 to add marker-conditional packages for (default {PYTHON_ALSO})")
    ap.add_argument("--keep-pins", action="store_true",
                    help="keep the committed unconditional pins; only recompute the conditional packages")
    ap.add_argument("--hold-pins", action="store_true",
                    help="resolve again with the committed pins as constraints: a new dependency is added "
                         "without moving what is already locked (unless it needs to)")
    args = ap.parse_args(argv)
    if not Path(args.python_also).is_file():
        sys.exit(f"scripts/lock.py: {args.python_also} is missing: the locks must also be resolved on an older "
                 f"CPython 3.11 (--python-also PATH; Debian's python3.11 is 3.11.2)")
    pyproject = ROOT / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    with tempfile.TemporaryDirectory(prefix="trainflow-lock-") as tmp:
        work = Path(tmp)
        for variant in [v for v in VARIANTS if v in (args.variant or VARIANTS)]:
            if variant == "dev":
                base = parse_lock(ROOT / LOCK_FILES["cpu"]).pins
                held = {n: v for n, v in base.items() if n != "torch"}
                wanted = [*deps, *extra_requirements(pyproject)]
                target, digest, leave_out = ROOT / DEV_LOCK, inputs_sha256(pyproject, DEV_EXTRAS), frozenset(base)
            else:
                base, held, wanted = {}, None, deps
                target, digest, leave_out = ROOT / LOCK_FILES[variant], inputs_sha256(pyproject), frozenset()
                if args.hold_pins and target.is_file():
                    held = {n: v for n, v in parse_lock(target).pins.items()
                            if n != "torch" and n not in parse_lock(target).markers}
            if args.keep_pins:
                packages = lock_packages(target)
            else:
                packages = pylock_packages(pip_lock(variant, wanted, args.index_url, args.torch_cpu_wheels, work, held))
            pins = {**base, **{_canonical(p["name"]): p["version"] for p in packages}}
            packages += conditional_packages(variant, wanted, pins, args.python_also, args.index_url,
                                             args.torch_cpu_wheels, work)
            text = to_requirements(packages, variant, digest, leave_out)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
