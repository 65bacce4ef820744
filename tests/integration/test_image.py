"""The CPU image, built and run here: `make image-cpu`'s build (scripts/image.py, docker or podman;
with no registry, the bookworm base it makes), then the default pipeline inside it with no
network. Marked `image`; it skips, with the reason, where scripts/image.py cannot get an engine
(no docker engine and podman neither installed nor installable: not Debian, not root, or apt
unreachable). One build per session; its layers stay in the engine's storage, so a later run
rebuilds only what changed. Under `make test` (IMAGE_TEST=1, the default) the build runs beside
the whole suite from its start (`scripts/image.py alongside`) and this file runs last, so on a
fresh machine the build's minutes overlap the venv install and the suite instead of following them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import load_script
from tests.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.image]


@pytest.fixture(scope="module")
def image():
    return load_script("image")


@pytest.fixture(scope="module")
def built(image, tmp_path_factory) -> dict:
    """One `make image-cpu` build: its record (engine, ref, digest, seconds). Under `make test`
    (IMAGE_TEST=1, the default) the build ran beside the suite from its start (`scripts/image.py
    alongside`): wait for its outcome. With `make test-image` (TRAINFLOW_IMAGE_TEST=1) the same build
    runs here."""
    status = os.environ.get("TRAINFLOW_IMAGE_STATUS")
    if status:
        return _wait_for_build(Path(status), int(os.environ.get("TRAINFLOW_IMAGE_BUILDER", "0")))
    if os.environ.get("TRAINFLOW_IMAGE_TEST") != "1":
        pytest.skip("the image test runs under `make test` (its build beside the suite; not with IMAGE_TEST=0) "
                    "or `make test-image`")
    status = tmp_path_factory.mktemp("image") / "status.json"
    image.build_for_test(status)
    return _wait_for_build(status, 0)


def _wait_for_build(status: Path, builder: int, limit_s: float = 1800) -> dict:
    """The outcome `scripts/image.py test-build` writes when it ends: built, skip (why) or failed."""
    from core.procs import pid_alive

    def outcome_written() -> bool:
        if builder and not pid_alive(builder) and not status.exists():
            pytest.fail(f"the image build (pid {builder}) ended without an outcome; log:\n{_log_tail(status)}")
        return status.exists()

    try:
        wait_for(outcome_written, limit_s, "the image build's outcome", poll_s=2)
    except AssertionError:
        pytest.fail(f"the image build gave no outcome in {limit_s:.0f} s; log:\n{_log_tail(status)}")
    outcome = json.loads(status.read_text())
    if outcome["state"] == "skip":
        pytest.skip(outcome["reason"])
    assert outcome["state"] == "built", f"{outcome.get('error')}\n{_log_tail(status)}"
    record = outcome["record"]
    assert json.loads(status.with_name("image-cpu.json").read_text()) == record
    return record


def _log_tail(status: Path, chars: int = 4000) -> str:
    log = status.with_name("build.log")
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


@pytest.fixture(scope="module")
def pipeline_run(image, built, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`trainflow run` (the image's command, the default config) with TRAINFLOW_HOME on the host."""
    home = tmp_path_factory.mktemp("image-home")
    home.chmod(0o777)  # the image's user, uid 10001, writes there
    cmd = image.run_command(built["engine"], built["ref"], built["digest"], home,
                            ["trainflow", "run", "--summary-json", "/var/lib/trainflow/summary.json"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc, home


def test_the_image_runs_the_default_pipeline_offline_and_records_its_digest(image, built, pipeline_run):
    from mlflow.tracking import MlflowClient

    proc, home = pipeline_run
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((home / "summary.json").read_text())
    assert summary["status"] == "registered" and summary["model_version"] == "1"
    assert summary["manifest"]["image"] == {"ref": built["ref"].rsplit(":", 1)[0] + "@" + built["digest"],
                                            "digest": built["digest"]}
    # The registered version's tags, read from the MLflow database the container wrote.
    # Both URIs named: a registry URI set earlier in this process (another test) would win otherwise.
    db = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=db, registry_uri=db)
    mv = client.get_model_version(summary["model_name"], summary["model_version"])
    assert mv.tags["image_digest"] == built["digest"]
    # The digest is the built image's, as the engine reports it now.
    assert built["digest"] == image.image_digest(built["engine"], built["ref"])
    # The data version the image carries is the commit's (pulled from dvc-store/ at build time).
    assert summary["manifest"]["data"]["md5"] == mv.tags["data_md5"]


def test_the_image_holds_the_locked_environment_as_a_non_root_user(image, built):
    out = subprocess.run([built["engine"], "run", "--rm", "--network", "none", built["ref"], "sh", "-c",
                          "id -u; python --version; pip check; pip list --format=freeze | grep -i async-timeout"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    uid, python, check, async_timeout = out.stdout.split("\n")[:4]
    assert uid == "10001"
    if built["plan"]["build_args"].get("OS_PACKAGES"):  # the bookworm base: Debian's own 3.11.2
        assert python == "Python 3.11.2" and async_timeout.startswith("async-timeout==")
    assert check.startswith("No broken requirements")  # pip check


def test_no_layer_keeps_the_ca_bundle_or_the_torch_wheel(image, built):
    """The CA bundle was a build secret and the wheel folder a bind mount: neither is in any layer
    (read from the engine's storage, layer by layer, so a file deleted later would still show)."""
    if built["engine"] != "podman":
        pytest.skip("reads podman's layer store")
    history = subprocess.run(["podman", "history", "--no-trunc", "--format", "{{.CreatedBy}}", built["ref"]],
                             capture_output=True, text=True, check=True).stdout
    assert "id=ca_bundle" in history  # the build did use the secret
    layers = image_layers(built["ref"])
    assert len(layers) >= 5
    extra = [p for p in Path("/usr/local/share/ca-certificates").glob("**/*.crt")]
    needles = [line.encode() for p in extra for line in p.read_text().splitlines()[2:3]]
    for layer in layers:
        assert not list(layer.glob("run/secrets/*")), layer
        assert not list(layer.glob("wheels/*.whl")) and not list(layer.glob("**/torch-*.whl")), layer
        for folder in ("etc", "run", "root", "app", "usr/local/share/ca-certificates", "tmp"):
            for path in (layer / folder).rglob("*") if (layer / folder).is_dir() else []:
                if path.is_file() and not path.is_symlink() and path.stat().st_size < 2_000_000:
                    data = path.read_bytes()
                    assert not any(n in data for n in needles), f"{path} holds an extra CA certificate"


def image_layers(ref: str) -> list[Path]:
    """Each layer's own files (overlay's diff folders), base first."""
    fmt = "{{range .RootFS.Layers}}{{.}} {{end}}"
    diffs = subprocess.run(["podman", "image", "inspect", "--format", fmt, ref],
                           capture_output=True, text=True, check=True).stdout.split()
    store = Path(subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"],
                                capture_output=True, text=True, check=True).stdout.strip())
    layers = json.loads((store / "overlay-layers" / "layers.json").read_text())
    by_diff = {layer.get("diff-digest"): layer["id"] for layer in layers}
    return [store / "overlay" / by_diff[d] / "diff" for d in diffs]
