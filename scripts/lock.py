"""Write the hash-pinned lock files from pyproject.toml: ``make lock``.

    python scripts/lock.py            # both variants
    python scripts/lock.py --variant cpu

Resolution is ``pip lock`` (pip >= 25.1, PEP 751) for Linux x86_64 / CPython 3.11,
the platform of docker/Dockerfile, then converted to pip-compile's format
(``name==version --hash=sha256:...``) so ``pip install --require-hashes -r`` takes it.

torch: PyPI's Linux wheel of torch is the CUDA build (≈530 MB, plus several GB of
nvidia-* wheels). ``--use-feature=fast-deps`` reads each wheel's metadata with HTTP
range requests and ``pip lock`` never downloads the wheels themselves; hashes come
from the index. So:

- ``requirements/lock.txt``: torch as on PyPI (CUDA 13 build with its nvidia-* wheels):
  the GPU image.
- ``requirements/lock-cpu.txt``: ``torch==X+cpu`` from the PyTorch CPU index
  (https://download.pytorch.org/whl/cpu), nothing from nvidia: the CPU image and CI.
  Where that index is unreachable, ``--torch-cpu-wheels DIR`` (default: $TRAINFLOW_TORCH_CPU_WHEELS,
  else /opt/wheels when it holds the wheel) resolves against a local copy of the wheel.
- ``requirements/lock-dev.txt``: what the ``dev`` and ``team`` extras add (test tools, MLflow's
  auth app), resolved with every runtime package held at its ``lock-cpu.txt`` pin, so it installs
  with ``--no-deps`` on top of either runtime lock. Written after ``lock-cpu.txt``.

Pip's own configuration is ignored (PIP_CONFIG_FILE=/dev/null) so a local mirror or
find-links folder cannot leak into the lock; ``--index-url`` chooses another index.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lock import (  # noqa: E402
    DEV_EXTRAS, DEV_LOCK, HEADER_KEY, LOCK_FILES, extra_requirements, inputs_sha256, parse_lock,
)

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PLATFORM = "linux x86_64, CPython 3.11"
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


def _cpu_wheels_dir(arg: str | None, version: str) -> Path | None:
    candidates = [arg, os.environ.get("TRAINFLOW_TORCH_CPU_WHEELS"), "/opt/wheels"]
    for c in candidates:
        if c and any(Path(c).glob(f"torch-{version}+cpu-cp311-*.whl")):
            return Path(c)
    return None


def pip_lock(variant: str, deps: list[str], index_url: str | None, cpu_wheels: str | None, work: Path,
             pins: dict[str, str] | None = None) -> Path:
    """Run ``pip lock`` for one variant; return the pylock.toml it wrote.

    ``pins`` (the dev variant): name -> version every runtime package is held at.
    """
    reqs = work / f"requirements-{variant}.in"
    reqs.write_text("\n".join(deps) + "\n")
    out = work / f"pylock-{variant}.toml"
    cmd = [sys.executable, "-m", "pip", "lock", "--use-feature=fast-deps", "-q", "-r", str(reqs), "-o", str(out)]
    if index_url:
        cmd += ["--index-url", index_url]
    if variant in ("cpu", "dev"):
        version = _torch_pin(deps)
        cons = work / f"constraints-{variant}.txt"
        held = {**(pins or {}), "torch": f"{version}+cpu"}
        cons.write_text("".join(f"{name}=={v}\n" for name, v in sorted(held.items())))
        cmd += ["-c", str(cons)]
        wheels = _cpu_wheels_dir(cpu_wheels, version)
        cmd += ["--find-links", str(wheels)] if wheels else ["--extra-index-url", TORCH_CPU_INDEX]
    subprocess.run(cmd, check=True, env=_pip_env(), cwd=work)
    return out


def to_requirements(pylock: Path, variant: str, digest: str, leave_out: frozenset[str] = frozenset()) -> str:
    """pylock.toml -> pip-compile style text with a header that records the input hash.

    ``leave_out``: canonical names another lock already pins (the dev lock only adds).
    """
    data = tomllib.loads(pylock.read_text())
    lines = [
        "# trainflow lock file: generated by `make lock` (scripts/lock.py) from pyproject.toml; do not edit.",
        f"# {HEADER_KEY}: {digest}",
        f"# variant: {variant}",
        f"# platform: {PLATFORM}",
        f"# install: {INSTALL[variant]}",
        "",
    ]
    for pkg in sorted(data["packages"], key=lambda p: p["name"].lower()):
        if re.sub(r"[-_.]+", "-", pkg["name"]).lower() in leave_out:
            continue
        if "version" not in pkg:
            raise SystemExit(f"scripts/lock.py: {pkg['name']} resolved to a non-index source {pkg}")
        files = [*pkg.get("wheels", []), *([pkg["sdist"]] if "sdist" in pkg else [])]
        hashes = sorted({f["hashes"]["sha256"] for f in files})
        if not hashes:
            raise SystemExit(f"scripts/lock.py: {pkg['name']}=={pkg['version']} came without a sha256")
        lines.append(f"{pkg['name']}=={pkg['version']} \\")
        lines += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS, action="append",
                    help="which lock to write (default: all)")
    ap.add_argument("--index-url", help="package index (default: PyPI)")
    ap.add_argument("--torch-cpu-wheels", help="folder holding torch's +cpu wheel, instead of the PyTorch CPU index")
    args = ap.parse_args(argv)
    pyproject = ROOT / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    with tempfile.TemporaryDirectory(prefix="trainflow-lock-") as tmp:
        for variant in [v for v in VARIANTS if v in (args.variant or VARIANTS)]:
            if variant == "dev":
                base = parse_lock(ROOT / LOCK_FILES["cpu"]).pins
                pins = {n: v for n, v in base.items() if n != "torch"}
                pylock = pip_lock(variant, [*deps, *extra_requirements(pyproject)], args.index_url,
                                  args.torch_cpu_wheels, Path(tmp), pins)
                text = to_requirements(pylock, variant, inputs_sha256(pyproject, DEV_EXTRAS), frozenset(base))
                target = ROOT / DEV_LOCK
            else:
                pylock = pip_lock(variant, deps, args.index_url, args.torch_cpu_wheels, Path(tmp))
                text = to_requirements(pylock, variant, inputs_sha256(pyproject))
                target = ROOT / LOCK_FILES[variant]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            print(f"wrote {target.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
