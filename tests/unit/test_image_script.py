"""scripts/image.py's command lines and choices (no engine runs here; the image test builds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def image():
    return load_script("image")


def _args(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, tok in enumerate(cmd) if tok == "--build-arg")


def test_podman_build_is_stamped_layered_and_keeps_secrets_and_wheels_out_of_layers(image):
    plan = image.Plan(engine="podman", variant="cpu", tag="localhost/trainflow:cpu",
                      build_args={"CPU_BASE": "localhost/trainflow-base@sha256:" + "a" * 64,
                                  "PIP_EXTRA": "--find-links /wheels"},
                      ca_bundle="/etc/ssl/certs/ca-certificates.crt", wheels="/opt/wheels", epoch=1764550000)
    cmd = image.build_command(plan)
    assert cmd[:6] == ["podman", "build", "-f", "docker/Dockerfile", "-t", "localhost/trainflow:cpu"]
    assert cmd[-1] == "."  # the repository root is the context: the Dockerfile itself, unmodified
    args = _args(cmd)
    assert args == {"VARIANT": "cpu", "CPU_BASE": "localhost/trainflow-base@sha256:" + "a" * 64,
                    "PIP_EXTRA": "--find-links /wheels", "SOURCE_DATE_EPOCH": "1764550000"}
    # The CA bundle is a build secret, the wheel folder a read-only bind mount: neither a COPY.
    assert cmd[cmd.index("--secret") + 1] == "id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt"
    assert cmd[cmd.index("--volume") + 1] == "/opt/wheels:/wheels:ro"
    assert cmd[cmd.index("--timestamp") + 1] == "1764550000"
    assert "--layers" in cmd and "--no-cache" not in cmd


def test_docker_build_gets_only_what_docker_build_knows(image):
    plan = image.Plan(engine="docker", variant="cuda", tag="t", ca_bundle="/ca.pem", wheels="/opt/wheels",
                      epoch=5, no_cache=True)
    cmd = image.build_command(plan)
    assert _args(cmd) == {"VARIANT": "cuda", "SOURCE_DATE_EPOCH": "5"}  # BuildKit stamps from the arg
    assert "--secret" in cmd and "--no-cache" in cmd
    assert not {"--timestamp", "--volume", "--layers"} & set(cmd)


def test_run_command_passes_the_digest_offline_with_home_mounted(image):
    digest = "sha256:" + "b" * 64
    cmd = image.run_command("podman", "localhost/trainflow:cpu", digest, Path("/srv/h"), ["trainflow", "run"])
    assert cmd[:6] == ["podman", "run", "--rm", "--network", "none", "-e"]
    assert f"TRAINFLOW_IMAGE=localhost/trainflow@{digest}" in cmd and f"TRAINFLOW_IMAGE_DIGEST={digest}" in cmd
    assert cmd[cmd.index("-v") + 1] == "/srv/h:/var/lib/trainflow"
    assert cmd[-3:] == ["localhost/trainflow:cpu", "trainflow", "run"]
    # A registry with a port keeps its colon; no home, no mount.
    cmd = image.run_command("docker", "reg.example:5000/ml/trainflow:1.0", digest, None, [])
    assert f"TRAINFLOW_IMAGE=reg.example:5000/ml/trainflow@{digest}" in cmd and "-v" not in cmd


def test_mmdebstrap_makes_a_minbase_bookworm_tarball_with_the_dockerfile_packages(image):
    cmd = image.mmdebstrap_command(Path("/var/cache/x/bookworm.tar"), ("git", "python3.11"))
    assert cmd == ["mmdebstrap", "--quiet", "--variant=minbase", "--mode=root", "--format=tar",
                   "--include=git,python3.11", "bookworm", "/var/cache/x/bookworm.tar", image.DEBIAN_MIRROR]
    assert image.apt_install_command(["podman", "runc"]) == \
        ["apt-get", "install", "-y", "--no-install-recommends", "podman", "runc"]
    assert set(image.HOST_PACKAGES) == {"podman", "runc", "mmdebstrap"}
    # crun fails on cgroup-v1 hosts; the sandbox caps nofile/nproc below podman's defaults.
    assert 'runtime = "runc"' in image.CONTAINERS_CONF_TEXT and "nofile=20000:20000" in image.CONTAINERS_CONF_TEXT
    # The base is the tarball alone (no podman import, which would stamp it with the day it ran).
    assert image.BASE_CONTAINERFILE.splitlines() == ["FROM scratch", "ADD bookworm.tar /", 'CMD ["/bin/bash"]']


def test_bookworm_packages_are_the_dockerfile_defaults_by_debian_names(image):
    ubuntu = image.dockerfile_args()["OS_PACKAGES"].split()
    bookworm = [p for p in image.BOOKWORM_PACKAGES if not p.startswith("python3")]
    # Ubuntu 24.04's 64-bit time_t transition renamed two of them (t64); the rest are the same.
    assert sorted(p.removesuffix("t64") for p in ubuntu) == sorted(bookworm)
    assert {"libssl3t64", "libreadline8t64"} <= set(ubuntu) and {"libssl3", "libreadline8"} <= set(bookworm)
    assert {"python3.11", "python3.11-venv"} <= set(image.BOOKWORM_PACKAGES)


def test_registry_hosts_and_dockerfile_bases(image):
    assert image.registry_host("ubuntu:24.04@sha256:" + "c" * 64) == "registry-1.docker.io"
    assert image.registry_host("nvidia/cuda:13.0.1-runtime-ubuntu24.04") == "registry-1.docker.io"
    assert image.registry_host("nvcr.io/nvidia/pytorch:25.01") == "nvcr.io"
    assert image.registry_host("localhost:5000/x:1") == "localhost:5000"
    args = image.dockerfile_args()
    assert args["VARIANT"] == "cuda" and args["CPU_BASE"].startswith("ubuntu:24.04@sha256:")


def test_host_problem_is_one_line_or_none(image):
    problem = image.host_problem()
    assert problem is None or ("\n" not in problem and ("Debian" in problem or "root" in problem))


def test_torch_wheels_folder_must_hold_the_locked_wheel(image, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_TORCH_CPU_WHEELS", str(tmp_path))
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    version = image.parse_lock(Path(image.ROOT) / "requirements" / "lock-cpu.txt").pins["torch"]
    assert version.endswith("+cpu")
    found = image.torch_wheels(version)
    assert found is None or Path(found) != tmp_path
    (tmp_path / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert image.torch_wheels(version) == str(tmp_path.resolve())


def test_cli_errors_are_one_line(image, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(image, "record_path", lambda variant: tmp_path / f"image-{variant}.json")
    monkeypatch.setattr(image, "ROOT", tmp_path)
    assert image.main(["run", "--variant", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("image: ") and "\n" not in err and "make image-cpu" in err
