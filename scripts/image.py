"""Build and run trainflow's container image: ``make image-cpu`` (CPU) and ``make image`` (CUDA).

    python3 scripts/image.py build [--variant cpu|cuda] [--no-cache]   # docker or podman
    python3 scripts/image.py run [--home DIR] [-- COMMAND ...]          # the built image, its digest recorded
    python3 scripts/image.py host                                       # podman on a Debian host (root, apt)
    python3 scripts/image.py base                                       # the bookworm base (mmdebstrap)
    python3 scripts/image.py repro [--variant cpu]                      # build twice, compare digests
    python3 scripts/image.py alongside -- COMMAND ...                   # COMMAND with the image test's build beside it

``build`` always builds ``docker/Dockerfile``; what differs between hosts goes in as build args
(docs/image.md). The result goes to ``build/image-<variant>.json``, which ``run`` reads to record
the image in the run manifest. Standard library only (with ``core.procs`` and ``core.lock``): it
runs before any venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.lock import parse_lock  # noqa: E402  (standard library only)
from core.procs import parent_death_signal, stop_group  # noqa: E402

DOCKERFILE = "docker/Dockerfile"
CACHE = Path(os.environ.get("TRAINFLOW_IMAGE_CACHE", "/var/cache/trainflow-image"))
BASE_TAG = "localhost/trainflow-base:bookworm"
DEBIAN_MIRROR = os.environ.get("TRAINFLOW_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# mmdebstrap, not debootstrap: faster, and with SOURCE_DATE_EPOCH its tarball is the same bytes on every host.
HOST_PACKAGES = ("podman", "runc", "mmdebstrap")
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
# Written by `host` where none exists: crun fails on hybrid cgroups here, and the sandbox forbids
# raising nofile/nproc to podman's defaults.
CONTAINERS_CONF_TEXT = """\
# Written by trainflow's scripts/image.py host (delete to let it write it again).
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""
# The Dockerfile's OS_PACKAGES by bookworm's names (Ubuntu 24.04's are t64), plus Debian's CPython 3.11.
BOOKWORM_PACKAGES = ("python3.11", "python3.11-venv", "libssl3", "libffi8", "libsqlite3-0", "libbz2-1.0",
                     "liblzma5", "zlib1g", "libexpat1", "libuuid1", "libncursesw6", "libreadline8")
# What the Dockerfile installs on every base besides OS_PACKAGES; the bookworm base holds it already.
DOCKERFILE_PACKAGES = ("ca-certificates", "git", "tini", "tzdata")
# The tarball as the base's one layer, built with --timestamp (podman import would stamp it with today).
BASE_CONTAINERFILE = 'FROM scratch\nADD bookworm.tar /\nCMD ["/bin/bash"]\n'
WHEELS_MOUNT = "/wheels"


class ImageError(RuntimeError):
    """One line for the user: what failed and what to do."""


@dataclass
class Plan:
    """Everything one build needs."""
    engine: str                                  # docker | podman
    variant: str                                 # cpu | cuda
    tag: str
    build_args: dict[str, str] = field(default_factory=dict)
    ca_bundle: str | None = None                 # host file -> build secret ca_bundle
    wheels: str | None = None                    # host folder -> /wheels (podman only)
    epoch: int | None = None                     # SOURCE_DATE_EPOCH
    no_cache: bool = False


# -- command lines (pure) -----------------------------------------------------------------------
def build_command(plan: Plan) -> list[str]:
    """The docker/podman command line that builds ``plan`` from the repository root."""
    cmd = [plan.engine, "build", "-f", DOCKERFILE, "-t", plan.tag]
    args = {"VARIANT": plan.variant, **plan.build_args}
    if plan.epoch is not None:
        args["SOURCE_DATE_EPOCH"] = str(plan.epoch)
    for key, value in args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    if plan.ca_bundle:
        cmd += ["--secret", f"id=ca_bundle,src={plan.ca_bundle}"]
    if plan.engine == "podman":
        cmd += ["--layers", "--network", "host"]  # host network: no container network to set up
        if plan.epoch is not None:
            cmd += ["--timestamp", str(plan.epoch)]   # created time and every file's time in the layers
        if plan.wheels:
            cmd += ["--volume", f"{plan.wheels}:{WHEELS_MOUNT}:ro"]
    if plan.no_cache:
        cmd.append("--no-cache")
    return [*cmd, "."]


def mmdebstrap_command(target: Path, packages: tuple[str, ...], mirror: str = DEBIAN_MIRROR) -> list[str]:
    """mmdebstrap's command line for the bookworm base: minbase plus ``packages``, as one tarball."""
    return ["mmdebstrap", "--quiet", "--variant=minbase", "--mode=root", "--format=tar",
            f"--include={','.join(packages)}", "bookworm", str(target), mirror]


def run_command(engine: str, image: str, digest: str, home: Path | None, command: list[str]) -> list[str]:
    """The command line that runs ``image`` with its ref and digest in the environment (the run manifest
    records them), no network; ``home``: a host folder for TRAINFLOW_HOME, to outlive the container."""
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    cmd = [engine, "run", "--rm", "--network", "none",
           "-e", f"TRAINFLOW_IMAGE={repo}@{digest}", "-e", f"TRAINFLOW_IMAGE_DIGEST={digest}"]
    if home is not None:
        cmd += ["-v", f"{home}:/var/lib/trainflow"]
    return [*cmd, image, *command]


def apt_install_command(missing: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *missing]


def registry_host(ref: str) -> str:
    """The registry API host of an image ref (Docker Hub for a bare name such as ``ubuntu:24.04``)."""
    first = ref.split("/", 1)[0]
    if "/" in ref and ("." in first or ":" in first or first == "localhost"):
        return first
    return "registry-1.docker.io"


def dockerfile_args(path: Path | None = None) -> dict[str, str]:
    """The Dockerfile's ``ARG NAME=default`` values (the bases, OS_PACKAGES, ...); the first wins."""
    out: dict[str, str] = {}
    for line in (path or ROOT / DOCKERFILE).read_text().splitlines():
        if line.startswith("ARG ") and "=" in line:
            key, _, value = line[4:].partition("=")
            out.setdefault(key.strip(), value.strip().strip('"'))
    return out


# -- the host ----------------------------------------------------------------------------------
def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("image: $ " + shlex.join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, check=True, **kw)


def _ok(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def engine_available() -> str | None:
    """docker when its engine answers, else podman when installed, else None."""
    if shutil.which("docker") and _ok(["docker", "info"]):
        return "docker"
    if shutil.which("podman"):
        return "podman"
    return None


def missing_debian_packages(names: tuple[str, ...]) -> list[str]:
    return [name for name in names if "install ok installed" not in subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True).stdout]


def host_problem() -> str | None:
    """Why ``host`` cannot install podman here, or None when it can (Debian, root, apt-get)."""
    if not Path("/etc/debian_version").is_file() or not shutil.which("apt-get"):
        return "not a Debian host (no apt-get): install podman or docker yourself"
    if os.geteuid() != 0:
        return "installing podman needs root (apt-get); run as root or install podman yourself"
    return None


def setup_host() -> list[str]:
    """Install podman, runc and mmdebstrap where missing and write containers.conf where absent;
    returns what it did. Raises ImageError when it cannot."""
    done = []
    missing = missing_debian_packages(HOST_PACKAGES)
    if missing:
        if problem := host_problem():
            raise ImageError(f"missing {' '.join(missing)}: {problem}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            _run(apt_install_command(missing), env=env, stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            try:  # stale package lists
                _run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL)
                _run(apt_install_command(missing), env=env, stdout=subprocess.DEVNULL)
            except subprocess.CalledProcessError as exc:
                raise ImageError(f"apt-get could not install {' '.join(missing)} (exit {exc.returncode}); "
                                 f"is a Debian mirror reachable?") from None
        done.append("installed " + " ".join(missing))
    if not CONTAINERS_CONF.exists() and os.geteuid() == 0:  # rootless podman: the user's config is theirs
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(CONTAINERS_CONF_TEXT)
        done.append(f"wrote {CONTAINERS_CONF}")
    return done


def registry_reachable(ref: str, timeout: float = 5.0) -> bool:
    """Whether the registry serving ``ref`` answers its API (401/200 with the registry header)."""
    try:
        with urllib.request.urlopen(f"https://{registry_host(ref)}/v2/", timeout=timeout) as resp:
            return "Docker-Distribution-Api-Version" in resp.headers or resp.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401 or "Docker-Distribution-Api-Version" in exc.headers
    except (OSError, ValueError):
        return False


def url_reachable(url: str, timeout: float = 5.0) -> bool:
    try:
        urllib.request.urlopen(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def inspect(engine: str, ref: str, fmt: str) -> str | None:
    out = subprocess.run([engine, "image", "inspect", "--format", fmt, ref], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def image_digest(engine: str, ref: str) -> str:
    """The image's digest as the engine reports it: podman's manifest digest; docker's image id
    (the config digest; its manifest digest exists only once pushed)."""
    value = inspect(engine, ref, "{{.Digest}}" if engine == "podman" else "{{.Id}}")
    if not value:
        raise ImageError(f"{engine} has no image {ref}")
    return value if value.startswith("sha256:") else f"sha256:{value}"


def make_base(engine: str, epoch: int | None = None) -> str:
    """The bookworm base, made once and kept in the engine's storage; returns it by digest
    (``localhost/trainflow-base@sha256:...``), as a registry base would be named."""
    if engine != "podman":
        raise ImageError("the registry-free base is made with podman (run `scripts/image.py host`)")
    if inspect(engine, BASE_TAG, "{{.Id}}") is None:
        if not shutil.which("mmdebstrap"):
            raise ImageError("mmdebstrap is missing: run `python3 scripts/image.py host` (Debian, root)")
        epoch = build_epoch() if epoch is None else epoch
        context = CACHE / "base-bookworm"
        shutil.rmtree(context, ignore_errors=True)
        context.mkdir(parents=True)
        try:
            _run(mmdebstrap_command(context / "bookworm.tar", (*DOCKERFILE_PACKAGES, *BOOKWORM_PACKAGES)),
                 env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)}, stdout=subprocess.DEVNULL)
            (context / "Containerfile").write_text(BASE_CONTAINERFILE)
            _run([engine, "build", "--timestamp", str(epoch), "-f", str(context / "Containerfile"),
                  "-t", BASE_TAG, str(context)], stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as exc:
            raise ImageError(f"making the bookworm base failed ({exc.cmd[0]} exit {exc.returncode}); "
                             f"its output is above") from None
        finally:
            shutil.rmtree(context, ignore_errors=True)
    return f"{BASE_TAG.rsplit(':', 1)[0]}@{image_digest(engine, BASE_TAG)}"


def ca_bundle() -> str | None:
    """The host's CA bundle (with any extra, e.g. a proxy's, certificates): pip's own setting first."""
    for candidate in (os.environ.get("TRAINFLOW_CA_BUNDLE"), os.environ.get("PIP_CERT"),
                      os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def torch_wheels(version: str) -> str | None:
    """A local folder holding the locked torch wheel (TRAINFLOW_TORCH_CPU_WHEELS, PIP_FIND_LINKS,
    /opt/wheels), or None."""
    candidates = [os.environ.get("TRAINFLOW_TORCH_CPU_WHEELS"), *os.environ.get("PIP_FIND_LINKS", "").split(),
                  "/opt/wheels"]
    return next((str(Path(c).resolve()) for c in candidates
                 if c and Path(c).is_dir() and any(Path(c).glob(f"torch-{version}-cp311-*.whl"))), None)


# SOURCE_DATE_EPOCH for every build: a constant, not the commit's time. podman reuses a cached step
# whatever --timestamp says, so with a moving epoch a cached build differed from a clean one.
EPOCH = 1767225600  # 2026-01-01T00:00:00Z


def build_epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH") or EPOCH)


def plan_build(variant: str, tag: str | None = None, no_cache: bool = False) -> Plan:
    """Choose the engine, the base and the torch source for this host (may set up podman and the base)."""
    engine = engine_available()
    if engine is None:
        print("image: [1/3] no docker engine and no podman: setting up podman (scripts/image.py host)")
        setup_host()
        engine = "podman"
    elif engine == "podman":
        setup_host()  # containers.conf, mmdebstrap: only what is missing
    plan = Plan(engine=engine, variant=variant, tag=tag or f"localhost/trainflow:{variant}",
                ca_bundle=ca_bundle(), epoch=build_epoch(), no_cache=no_cache)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    plan.build_args["GIT_SHA"] = sha.stdout.strip() if sha.returncode == 0 else "unknown"
    defaults = dockerfile_args()
    if variant == "cpu":
        if registry_reachable(defaults["CPU_BASE"]):
            print(f"image: [1/3] base: {defaults['CPU_BASE']} (registry reachable)")
        else:
            print("image: [1/3] no registry reachable: the Debian bookworm base made here (mmdebstrap, once)")
            base = make_base(engine, plan.epoch)
            plan.build_args.update(CPU_BASE=base, PYTHON_IMAGE=base, OS_PACKAGES=" ".join(BOOKWORM_PACKAGES))
            print(f"image:       base {base}")
        version = parse_lock(ROOT / "requirements" / "lock-cpu.txt").pins.get("torch")
        wheels = torch_wheels(version) if version and engine == "podman" else None
        if wheels:
            plan.wheels = wheels
            plan.build_args["PIP_EXTRA"] = f"--find-links {WHEELS_MOUNT}"
        elif not url_reachable("https://download.pytorch.org/whl/cpu/"):
            raise ImageError(f"torch=={version} is in no local folder (TRAINFLOW_TORCH_CPU_WHEELS) and "
                             f"download.pytorch.org is unreachable")
    elif not registry_reachable(defaults["CUDA_BASE"]):
        raise ImageError(f"the CUDA base's registry ({registry_host(defaults['CUDA_BASE'])}) is unreachable: "
                         f"`make image` needs it; `make image-cpu` builds without a registry")
    return plan


# -- commands ----------------------------------------------------------------------------------
def record_path(variant: str) -> Path:
    return ROOT / "build" / f"image-{variant}.json"


def build(variant: str, tag: str | None = None, no_cache: bool = False, record: Path | None = None) -> dict:
    t0 = time.monotonic()
    plan = plan_build(variant, tag, no_cache)
    print(f"image: [2/3] building {plan.tag} with {plan.engine}", flush=True)
    t1 = time.monotonic()
    try:
        _run(build_command(plan), cwd=ROOT)
    except subprocess.CalledProcessError as exc:
        raise ImageError(f"{plan.engine} build failed (exit {exc.returncode}); its output is above") from None
    built = time.monotonic() - t1
    size = inspect(plan.engine, plan.tag, "{{.Size}}")
    result = {"engine": plan.engine, "variant": variant, "ref": plan.tag, "digest": image_digest(plan.engine, plan.tag),
              "id": inspect(plan.engine, plan.tag, "{{.Id}}"), "size_bytes": int(size) if size else None,
              "git_sha": plan.build_args.get("GIT_SHA"), "source_date_epoch": plan.epoch,
              "build_s": round(built, 1), "total_s": round(time.monotonic() - t0, 1), "plan": asdict(plan)}
    out = record or record_path(variant)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    gb = f"{result['size_bytes'] / 1e9:.2f} GB" if result["size_bytes"] else "size unknown"
    print(f"image: [3/3] {plan.tag} {result['digest']} ({gb}; build {built:.0f} s, all {result['total_s']:.0f} s)",
          flush=True)
    return result


def run(variant: str, home: Path | None, command: list[str]) -> int:
    path = record_path(variant)
    if not path.is_file():
        raise ImageError(f"{path.relative_to(ROOT)} is missing: build first (make image-{variant})")
    rec = json.loads(path.read_text())
    if home is not None:
        home = home.resolve()
        home.mkdir(parents=True, exist_ok=True)
        os.chmod(home, 0o777)   # the image's user (uid 10001) writes there
    return subprocess.run(run_command(rec["engine"], rec["ref"], rec["digest"], home, command)).returncode


def repro(variant: str) -> int:
    """Build twice, the second without the layer cache, and compare the digests."""
    first = build(variant, record=ROOT / "build" / f"image-{variant}-repro1.json")
    second = build(variant, no_cache=True, record=ROOT / "build" / f"image-{variant}-repro2.json")
    same = first["digest"] == second["digest"]
    print(f"repro: first {first['digest']} id {first['id']}")
    print(f"repro: second {second['digest']} id {second['id']} (no layer cache)")
    print(f"repro_same_digest={str(same).lower()}")
    return 0 if same else 1


# -- the image test's build, alongside the rest of `make test` ----------------------------------
STATUS = ROOT / "build" / "image-test" / "status.json"


def write_status(path: Path, state: str, **fields) -> None:
    """The builder's outcome (``built``, ``skip`` with why, ``failed``), written whole (rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"state": state, **fields}, indent=2) + "\n")
    tmp.replace(path)


def smoke_problem(engine: str, ref: str) -> str | None:
    """Why ``engine`` cannot run a container of ``ref`` here (one line), or None when it can."""
    out = subprocess.run([engine, "run", "--rm", "--network", "none", ref, "true"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        return None
    last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    return f"{engine} is installed but cannot run a container here: {last}"


def build_for_test(status: Path, variant: str = "cpu") -> int:
    """The image test's build: set the host up, build ``variant`` and record the outcome in ``status``:
    ``skip`` where the host cannot have an engine, ``failed`` (the image test failing) when a build fails."""
    status.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        engine = engine_available()
        if engine is None and (problem := host_problem()):
            write_status(status, "skip", reason=f"no container engine and scripts/image.py cannot install podman: {problem}")
            return 0
        if engine != "docker":
            try:
                setup_host()
            except ImageError as exc:
                write_status(status, "skip", reason=f"scripts/image.py could not set up podman: {exc}")
                return 0
            engine = "podman"
            if variant == "cpu" and not registry_reachable(dockerfile_args()["CPU_BASE"]):
                make_base(engine)
                if problem := smoke_problem(engine, BASE_TAG):
                    write_status(status, "skip", reason=problem)
                    return 0
        record = build(variant, record=status.with_name(f"image-{variant}.json"))
    except (ImageError, OSError, subprocess.SubprocessError) as exc:
        write_status(status, "failed", error=str(exc), seconds=round(time.monotonic() - t0, 1))
        return 1
    write_status(status, "built", record=record, seconds=round(time.monotonic() - t0, 1))
    return 0


def _builder_preexec():
    """For the builder, between fork and exec: nice 19 for what it runs on the host (podman's RUN steps
    get cgroups of their own at the default weight: lowering that weight made `make test` slower), and
    SIGTERM when the process that started it dies."""
    bind = parent_death_signal(signal.SIGTERM)

    def preexec() -> None:
        os.nice(19)
        if bind is not None:
            bind()

    return preexec


def alongside(command: list[str], status: Path = STATUS, variant: str = "cpu",
              builder_cmd: list[str] | None = None) -> int:
    """Run ``command`` (the test suite) with the image test's build beside it from the start, so its
    minutes overlap the install and the suite. The command gets ``TRAINFLOW_IMAGE_STATUS`` and the
    builder's pid, which the image test waits on; the builder and all it started stop when the command
    ends, however it ends. ``builder_cmd`` replaces the builder (tests)."""
    status.parent.mkdir(parents=True, exist_ok=True)
    status.unlink(missing_ok=True)
    log = status.with_name("build.log")
    builder_cmd = builder_cmd or [sys.executable, str(Path(__file__).resolve()), "test-build",
                                  "--status", str(status), "--variant", variant]
    with log.open("w") as out:
        builder = subprocess.Popen(builder_cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=_builder_preexec())
    print(f"image: the image test's build runs beside the suite, niced (log: {log})", flush=True)
    env = {**os.environ, "TRAINFLOW_IMAGE_STATUS": str(status), "TRAINFLOW_IMAGE_BUILDER": str(builder.pid)}
    try:
        child = subprocess.Popen(command, env=env)
    except OSError:
        stop_builder(builder)
        raise
    forward = lambda sig, _frame: child.send_signal(sig)  # noqa: E731 - the command stops itself
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:  # the terminal's SIGINT reached the command too: let it finish
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_builder(builder)


def stop_builder(builder: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the builder's whole process group, SIGKILL to what is left after ``grace`` seconds."""
    if builder.poll() is None:
        print("image: stopping the image build (the suite ended first)", file=sys.stderr, flush=True)
    stop_group(builder.pid, grace)
    builder.wait()


def _stop_own_group(signum, _frame) -> None:
    """The builder's SIGTERM (from ``alongside``, or its parent's death): everything it started goes too."""
    signal.signal(signum, signal.SIG_IGN)
    os.killpg(0, signum)
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build docker/Dockerfile (docker or podman)")
    b.add_argument("--tag")
    b.add_argument("--no-cache", action="store_true")
    r = sub.add_parser("run", help="run the built image (default: trainflow run)")
    r.add_argument("--home", type=Path, help="host folder for TRAINFLOW_HOME (kept after the run)")
    sub.add_parser("host", help="install and configure podman, runc, mmdebstrap (Debian, root)")
    sub.add_parser("base", help="make the bookworm base (mmdebstrap, FROM scratch)")
    p = sub.add_parser("repro", help="build twice, compare digests")
    a = sub.add_parser("alongside", help="run COMMAND (the test suite) with the image test's build beside it")
    t = sub.add_parser("test-build", help="the image test's build; its outcome goes to --status")
    for parser in (b, r, p, t):
        parser.add_argument("--variant", choices=("cpu", "cuda"), default="cpu")
    for parser in (a, t):
        parser.add_argument("--status", type=Path, default=STATUS)
    for parser in (r, a):
        parser.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = getattr(args, "command", [])
    command = command[1:] if command[:1] == ["--"] else command
    try:
        if args.cmd == "build":
            build(args.variant, args.tag, args.no_cache)
        elif args.cmd == "run":
            return run(args.variant, args.home, command)
        elif args.cmd == "host":
            done = setup_host()
            print("image: host ready" + (": " + "; ".join(done) if done else " (nothing to do)"))
        elif args.cmd == "base":
            print(make_base(engine_available() or "podman"))
        elif args.cmd == "repro":
            return repro(args.variant)
        elif args.cmd == "alongside":
            if not command:
                ap.error("alongside needs a command (after --)")
            return alongside(command, args.status.resolve())
        elif args.cmd == "test-build":
            if os.getpgid(0) == os.getpid():  # a group of its own (alongside): take it down on SIGTERM
                signal.signal(signal.SIGTERM, _stop_own_group)
            return build_for_test(args.status.resolve(), args.variant)
    except ImageError as exc:
        print(f"image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
