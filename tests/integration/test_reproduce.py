"""``trainflow reproduce``: a registered model is trained again from its manifest, with the code of
its git commit and its DVC data version, and ends with bitwise-equal weights (CPU, same world
size). Refusals when the commit or the data is not there. Real Prefect, MLflow, DVC, torchrun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from tests.integration.conftest import DVC_BIN, GIT_ID, build_project, run

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

MODEL = "repro-digits"
CONFIG = "tests/configs/reproduce.yaml"  # two epochs, loose gates, its own model name


@pytest.fixture(scope="module")
def trained(tmp_path_factory, repo_root, bundled_data, prefect_api):
    """A project that commits its own code, and one pipeline run of it registered as @champion."""
    base = tmp_path_factory.mktemp("repro")
    proj = build_project(base / "proj", repo_root, bundled_data, with_code=True)
    home = base / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINFLOW_HOME", str(home))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.chdir(proj)
    try:
        out = base / "run.json"
        code = main(["run", "--config", CONFIG, "--summary-json", str(out)])
        summary = json.loads(out.read_text())
        assert code == 0, summary.get("error")
    finally:
        mp.undo()
    return proj, home, summary


@pytest.fixture
def env(trained, monkeypatch, clean_env):
    proj, home, summary = trained
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(proj)
    return trained


def reproduce(tmp_path, *args) -> tuple[int, dict]:
    out = tmp_path / "reproduce.json"
    code = main(["reproduce", *args, "--summary-json", str(out)])
    return code, json.loads(out.read_text())


def test_reproducing_the_champion_gives_bitwise_equal_weights(env, tmp_path, capsys, monkeypatch):
    proj, home, trained_summary = env
    monkeypatch.setenv("TRAINFLOW_IMAGE", "ghcr.io/acme/trainflow:2")  # not the image it was trained in
    code, s = reproduce(tmp_path, f"{MODEL}@champion")
    assert code == 0, s.get("error")
    assert s["reproduced"] is True and s["status"] == "reproduced"
    assert s["weights_sha256"] == s["expected_weights_sha256"] == trained_summary["training"]["weights_sha256"]
    assert s["model_version"] == trained_summary["model_version"]
    assert s["source_run_id"] == trained_summary["mlflow_run_id"]
    assert s["config_restored"] is True
    assert s["world_size"] == s["recorded_world_size"] == trained_summary["training"]["world_size"]
    assert any(w.startswith("image differs: trained in local") for w in s["warnings"])  # a warning, no refusal
    # It trained with the code of the recorded commit, not the installed one.
    assert not any("holds no trainflow code" in w for w in s["warnings"])
    assert "REPRODUCED" in capsys.readouterr().err
    # A run is logged, no version is registered.
    from mlflow import MlflowClient

    c = MlflowClient()
    run = c.get_run(s["reproduce_run_id"])
    assert run.data.tags["trainflow.stage"] == "reproduce" and run.data.tags["reproduced"] == "true"
    assert run.data.tags["trainflow.reproduces"] == trained_summary["mlflow_run_id"]
    assert [str(v.version) for v in c.search_model_versions(f"name='{MODEL}'")] == [trained_summary["model_version"]]


def test_other_weights_exit_5_with_reproduced_false(env, tmp_path):
    """The recorded hash is made wrong on purpose: the rerun must say it did not reproduce."""
    from mlflow import MlflowClient

    _, _, trained_summary = env
    c, version = MlflowClient(), trained_summary["model_version"]
    c.set_model_version_tag(MODEL, version, "weights_sha256", "0" * 64)
    try:
        code, s = reproduce(tmp_path, f"{MODEL}/{version}")
    finally:
        c.set_model_version_tag(MODEL, version, "weights_sha256", trained_summary["training"]["weights_sha256"])
    assert code == 5 and s["reproduced"] is False and s["status"] == "not_reproduced"
    assert s["weights_sha256"] == trained_summary["training"]["weights_sha256"] != s["expected_weights_sha256"]
    assert c.get_run(s["reproduce_run_id"]).data.tags["reproduced"] == "false"


def test_the_same_run_is_found_by_version_and_by_run_id(env, tmp_path):
    from flows.reproduce import _resolve

    _, _, trained_summary = env
    by_version = _resolve(f"{MODEL}/{trained_summary['model_version']}")
    by_run = _resolve(trained_summary["mlflow_run_id"])
    assert by_version[0] == by_run[0] == trained_summary["mlflow_run_id"]
    assert str(by_run[1].version) == trained_summary["model_version"]


def test_a_repository_without_the_commit_is_refused(env, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    run(["git", "init", "-q"], other)
    run([DVC_BIN, "init", "-q"], other)
    run(["git", *GIT_ID, "commit", "-qm", "empty"], other)
    code, s = reproduce(tmp_path, f"{MODEL}@champion", "--root", str(other))
    assert code == 6 and s["reproduced"] is False and s["status"] == "refused"
    sha = env[2]["manifest"]["git_sha"]
    assert f"git commit {sha} is not in" in s["error"]


def test_a_data_version_in_neither_cache_nor_remote_is_refused(env, tmp_path):
    proj = env[0]
    clone = tmp_path / "clone"  # has the commit, but not the DVC cache, and the project has no remote
    subprocess.run(["git", "clone", "-q", str(proj), str(clone)], check=True)
    code, s = reproduce(tmp_path, f"{MODEL}@champion", "--root", str(clone))
    assert code == 6 and s["reproduced"] is False
    md5 = env[2]["manifest"]["data"]["md5"]
    assert f"data version {md5}" in s["error"] and "neither the DVC cache" in s["error"]


def test_an_unknown_alias_is_refused(env, tmp_path):
    code, s = reproduce(tmp_path, f"{MODEL}@nope")
    assert code == 6 and "has no alias @nope" in s["error"]


def test_a_recorded_config_that_names_another_file_is_refused_before_anything_is_read(env, tmp_path):
    """config.json comes from the artifact store: an ``extends`` written into it would make this host
    read a file the store chose. The file no longer has the sha256 the run recorded: refused first,
    naming it, and nothing of the other file is read."""
    import mlflow

    from core.paths import tracking_uri

    proj, home, trained_summary = env
    run_id = trained_summary["mlflow_run_id"]
    outside = tmp_path / "outside.yaml"
    outside.write_text("name: leaked\ndataset: {path: secret}\n")
    mlflow.set_tracking_uri(tracking_uri(home))
    recorded = mlflow.artifacts.load_dict(f"runs:/{run_id}/config.json")
    client = mlflow.MlflowClient()
    stored = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://")) / "config.json"
    original = stored.read_bytes()
    # Relative, as `extends` must be, and climbing out of whatever folder the config is written to.
    tampered = {**recorded, "extends": "../" * 20 + str(outside).lstrip("/")}
    try:
        client.log_dict(run_id, tampered, "config.json")  # what any artifact-store writer can do
        code, s = reproduce(tmp_path, run_id)
        assert code == 6 and s["status"] == "refused"
        assert "config.json in the artifact store has sha256" in s["error"] and "leaked" not in json.dumps(s)
    finally:
        stored.write_bytes(original)
    assert mlflow.artifacts.load_dict(f"runs:/{run_id}/config.json") == recorded
