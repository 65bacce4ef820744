"""docker/Dockerfile: CUDA base with a CPU variant, installs only the hash-locked set, telemetry off,
and runs the CLI. (No Docker engine here: the image is parsed and checked, never built.)"""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from dockerfile_parse import DockerfileParser

from core.env import TELEMETRY_OFF
from core.lock import LOCK_FILES


@pytest.fixture(scope="module")
def dockerfile(repo_root):
    parser = DockerfileParser(str(repo_root / "docker" / "Dockerfile"))
    return parser, [(s["instruction"], s["value"]) for s in parser.structure if s["instruction"] != "COMMENT"]


def _args(instructions) -> dict[str, str]:
    return dict(v.split("=", 1) for i, v in instructions if i == "ARG" and "=" in v)


def _stages(instructions) -> dict[str, str]:
    out = {}
    for i, v in instructions:
        if i == "FROM":
            image, _, name = v.partition(" AS ")
            out[name.strip()] = image.strip()
    return out


def test_default_base_is_cuda_runtime_and_cpu_is_a_build_arg(dockerfile):
    _, ins = dockerfile
    args, stages = _args(ins), _stages(ins)
    assert args["VARIANT"] == "cuda"
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(cudnn-)?runtime-ubuntu\d+\.\d+@sha256:[0-9a-f]{64}",
                        args["CUDA_BASE"])
    assert stages["base-cuda"] == "${CUDA_BASE}" and stages["base-cpu"] == "${CPU_BASE}"
    # The final stage is chosen by VARIANT: both values name a stage.
    assert stages["runtime"] == "base-${VARIANT}"
    assert {"base-cuda", "base-cpu"} <= set(stages)


def test_each_variant_installs_its_lock_with_require_hashes(dockerfile, repo_root):
    _, ins = dockerfile
    envs = [v for i, v in ins if i == "ENV"]
    for variant, lock in LOCK_FILES.items():
        assert any(f"TRAINFLOW_LOCK={lock}" in e for e in envs), variant
        assert (repo_root / lock).is_file()
    cpu_env = next(e for e in envs if "lock-cpu.txt" in e)
    assert "download.pytorch.org/whl/cpu" in cpu_env  # torch's +cpu build lives on PyTorch's index
    installs = [v for i, v in ins if i == "RUN" and "pip install" in v]
    locked = [v for v in installs if "-r ${TRAINFLOW_LOCK}" in v]
    assert len(locked) == 1 and "--require-hashes" in locked[0] and "--no-deps" in locked[0]
    # Nothing else resolves dependencies from an index: the project itself goes in with --no-deps.
    others = [v for v in installs if v not in locked]
    assert others and all("--no-deps" in v for v in others)
    # The lock is copied before the code, so a code change reuses the installed layer.
    copies = [v for i, v in ins if i == "COPY"]
    assert copies.index("requirements/ requirements/") < copies.index(". .")


def test_telemetry_is_off_in_the_image(dockerfile):
    parser, _ = dockerfile
    for key, value in TELEMETRY_OFF.items():
        assert parser.envs.get(key) == value, key


def test_command_runs_the_cli_and_workers_can_replace_it(dockerfile, repo_root):
    from flows.cli import build_parser

    _, ins = dockerfile
    entry = json.loads(next(v for i, v in ins if i == "ENTRYPOINT"))
    cmd = json.loads(next(v for i, v in ins if i == "CMD"))
    # A bare init as entrypoint: Prefect's docker/kubernetes workers set the command
    # (`prefect flow-run execute`), which must not be swallowed as arguments of trainflow.
    assert entry == ["/usr/bin/tini", "--"]
    scripts = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    assert cmd[0] in scripts and scripts[cmd[0]] == "flows.cli:main"
    build_parser().parse_args(cmd[1:])  # a real subcommand with valid arguments


def test_dockerignore_keeps_local_state_out_of_the_context(repo_root):
    ignored = set((repo_root / ".dockerignore").read_text().split())
    assert {".venv", ".trainflow", ".git", "data/*", "!data/*.dvc"} <= ignored
    # DVC's local config holds remote credentials; its cache and temp files are local state.
    assert {".dvc/config.local", ".dvc/cache", ".dvc/tmp"} <= ignored
    assert "dvc-store" not in ignored and "requirements" not in ignored


def test_every_base_image_is_pinned_by_digest_with_its_tag(dockerfile):
    _, ins = dockerfile
    args = _args(ins)
    bases = {name: args[name] for name in ("CUDA_BASE", "CPU_BASE", "PYTHON_IMAGE")}
    for name, ref in bases.items():
        # REPO:TAG@sha256:<64 hex>: the digest decides what is pulled, the tag says what it was.
        assert re.fullmatch(r"[a-z0-9./-]+:[\w.-]+@sha256:[0-9a-f]{64}", ref), (name, ref)
    # Every FROM names a pinned base through one of those args, or an earlier stage.
    stages: list[str] = []
    for i, v in ins:
        if i != "FROM":
            continue
        image, _, stage = v.partition(" AS ")
        image = image.strip()
        assert image in {"${CUDA_BASE}", "${CPU_BASE}", "${PYTHON_IMAGE}"} or \
            image.replace("${VARIANT}", "cuda") in stages, image
        stages.append(stage.strip())


def test_image_runs_as_a_numeric_non_root_user(dockerfile):
    _, ins = dockerfile
    runtime = ins[max(n for n, (i, v) in enumerate(ins) if i == "FROM"):]
    users = [v for i, v in runtime if i == "USER"]
    assert users, "the runtime stage sets no USER: the container would run as root"
    user = users[-1].split(":")
    assert user[0].isdigit() and int(user[0]) != 0 and (len(user) == 1 or int(user[1]) != 0)
    # The switch comes after the last RUN (installs need root) and before the command.
    last = {i: n for n, (i, _) in enumerate(runtime)}
    assert last["RUN"] < last["USER"] < last["CMD"]
    made = next(v for i, v in runtime if i == "RUN" and "useradd" in v)
    assert f"--uid {user[0]}" in made
    # It may write its run state and DVC's pulls; everything else stays root's.
    chowned = next(v for i, v in runtime if i == "RUN" and "chown" in v)
    assert "/var/lib/trainflow" in chowned and ".dvc/cache" in chowned and " . " not in chowned + " "


def _runtime_runs(ins) -> list[str]:
    runtime = ins[max(n for n, (i, v) in enumerate(ins) if i == "FROM"):]
    return [v for i, v in runtime if i == "RUN"]


def test_ca_bundle_is_a_build_secret_and_no_layer_copies_certificates(dockerfile):
    _, ins = dockerfile
    locked = next(v for v in _runtime_runs(ins) if "-r ${TRAINFLOW_LOCK}" in v)
    # The secret is mounted for the lock's install only, and pip reads it from there.
    assert locked.startswith("--mount=type=secret,id=ca_bundle")
    assert "PIP_CERT=/run/secrets/ca_bundle" in locked
    copies = [v for i, v in ins if i in ("COPY", "ADD")]
    assert not [v for v in copies if any(w in v.lower() for w in ("cert", ".crt", ".pem", "ca_bundle"))]
    assert not [v for i, v in ins if i == "ENV" and "CERT" in v]


def test_the_os_packages_follow_the_base_through_a_build_arg(dockerfile):
    _, ins = dockerfile
    apt = next(v for v in _runtime_runs(ins) if "apt-get install" in v)
    assert "${OS_PACKAGES}" in apt and "t64" not in apt  # names live in the arg, not the command
    default = next(v for i, v in ins if i == "ARG" and v.startswith("OS_PACKAGES=")).split("=", 1)[1].strip('"')
    assert {"libssl3t64", "libreadline8t64"} <= set(default.split())  # Ubuntu 24.04, the default base


def test_layers_leave_out_what_differs_between_two_builds(dockerfile):
    """Same commit, lock and base -> same digest: no pip cache, no timestamped .pyc, no logs."""
    _, ins = dockerfile
    runs = _runtime_runs(ins)
    installs = [v for v in runs if "pip install" in v]
    assert installs and all("--no-cache-dir" in v and "--no-compile" in v for v in installs)
    # Each install compiles its own files, in its own layer, by content hash (not by mtime).
    for run in installs:
        assert "compileall" in run and "PYTHONHASHSEED=0" in run, run
        assert "--invalidation-mode unchecked-hash" in run or "PycInvalidationMode.UNCHECKED_HASH" in run
        assert run.index("pip install") < run.index("compileall")
    assert not [v for v in runs if "compileall" in v and "pip install" not in v]
    apt = next(v for v in runs if "apt-get install" in v)
    assert "/var/log/*" in apt and "/var/cache/ldconfig/aux-cache" in apt
    assert any("useradd" in v and "--no-log-init" in v for v in runs)
    runtime = ins[max(n for n, (i, v) in enumerate(ins) if i == "FROM"):]
    assert ("ARG", "SOURCE_DATE_EPOCH") in runtime  # useradd reads it from the environment


def test_the_image_carries_the_commits_data_version(dockerfile, repo_root):
    _, ins = dockerfile
    pull = next(v for v in _runtime_runs(ins) if "dvc pull" in v)
    assert "no_scm = true" in pull  # no .git in the image
    assert pull.index("no_scm") < pull.index("dvc pull") and "rm -rf .dvc/cache" in pull
    ignored = set((repo_root / ".dockerignore").read_text().split())
    assert "data-stdlib" in ignored and "dvc-store" not in ignored and ".dvc/config" not in ignored
