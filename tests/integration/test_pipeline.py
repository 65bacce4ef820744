"""The whole flow end to end: real Prefect, MLflow (sqlite), DVC, GX and torchrun (2 CPU procs)."""

from __future__ import annotations

import base64
import json
import subprocess

import numpy as np
import pandas as pd
import pytest

from flows.cli import main
from tests.conftest import VENV_BIN
from tests.engine_helpers import processes_mentioning

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

# Six epochs pass the real gates; a hung job fails the test in minutes, not after 15.
CONFIG = "tests/configs/digits-pipeline.yaml"
FAST = ["--config", CONFIG]
# Two epochs and loose gates: for the runs about how the pipeline runs (resume, auto layout), not how well.
QUICK_CONFIG = "tests/configs/digits-quick.yaml"
QUICK = ["--config", QUICK_CONFIG]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("trainflow-home")


@pytest.fixture
def state(home, monkeypatch, clean_env):
    """One MLflow registry shared by this module's runs (the champion carries over)."""
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home


def run_cli(args, tmp_path) -> tuple[int, dict]:
    out = tmp_path / "summary.json"
    code = main(["run", *args, "--summary-json", str(out)])
    return code, json.loads(out.read_text())


def assert_progress_artifact(flow_run_id) -> None:
    import re

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey, LogFilter,
                                                LogFilterFlowRunId)

    with get_client(sync_client=True) as prefect:
        found = prefect.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["training-progress"]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
        logs = [entry.message for entry in prefect.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))]
    assert len(found) == 1 and found[0].type == "progress" and float(found[0].data) == 100.0
    assert "done: step" in found[0].description and "samples/s" in found[0].description
    updates = [int(m) for line in logs for m in re.findall(r"training progress: (\d+) update\(s\)", line)]
    assert updates and updates[0] >= 2
    assert len([line for line in logs if line.startswith("training progress: step")]) >= 1


def client():
    from mlflow.tracking import MlflowClient

    return MlflowClient()


def monitor_threads() -> list:
    import threading

    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]


@pytest.fixture(scope="module")
def training_log_faults() -> list[str]:
    """What ``first_run``'s injected MLflow failure hit (filled by it)."""
    return []


@pytest.fixture(scope="module")
def first_run(prefect_api, repo_root, bundled_data, home, tmp_path_factory, training_log_faults):
    """The first pipeline run of the module: registers v1 and makes it champion. MLflow fails once
    right after training (logging the job's result), as a dropped connection would."""
    from registry import store

    log_file = store.log_file

    def fails_once_after_training(run_id, path, artifact_path=None):
        if artifact_path == "training" and not training_log_faults:
            training_log_faults.append(str(path))
            raise ConnectionError("injected: the tracking server dropped the connection after training")
        return log_file(run_id, path, artifact_path)

    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINFLOW_HOME", str(home))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.chdir(repo_root)
    mp.setattr(store, "log_file", fails_once_after_training)
    try:
        code, summary = run_cli(FAST, tmp_path_factory.mktemp("first"))
    finally:
        mp.undo()
    return code, summary


def test_full_flow_registers_champion_with_manifest_tags(first_run, state, bundled_data, tmp_path):
    code, s = first_run
    assert code == 0, s.get("error")
    assert s["status"] == "registered" and s["exit_code"] == 0
    assert s["model_name"] == "digits-classifier" and s["model_version"] == "1"
    assert set(s["aliases"]) == {"challenger", "champion"}
    assert s["metrics"]["accuracy"] >= 0.95
    assert s["training"]["world_size"] == 2 and s["training"]["backend"] == "gloo"
    assert s["candidate_scored_in"] == "worker"  # rank 0 scored the program it exported
    assert all(g["passed"] for g in s["gates"]) and len(s["gates"]) == 6  # 4 thresholds, classes, baseline; no champion
    assert s["tracking_uri"].startswith("sqlite:////")
    mv = client().get_model_version_by_alias("digits-classifier", "champion")
    dvc_md5 = __import__("yaml").safe_load((bundled_data.parent / "digits.dvc").read_text())["outs"][0]["md5"]
    for key in ("git_sha", "config_sha256", "data_md5", "image_digest", "packages_sha256", "weights_sha256"):
        assert mv.tags.get(key), key
    assert mv.tags["data_md5"] == dvc_md5 == s["manifest"]["data"]["md5"]
    assert mv.run_id == s["mlflow_run_id"]
    run = client().get_run(s["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    # Rank 0's per-epoch metrics, relayed from its metrics file into the pipeline's single run,
    # each epoch once at its own step; its params too.
    val_acc = client().get_metric_history(run.info.run_id, "train/val_accuracy")
    assert sorted(m.step for m in val_acc) == [1, 2, 3, 4, 5, 6]
    assert run.data.params["train.world_size"] == "2" and run.data.params["train.backend"] == "gloo"
    assert "test/accuracy" in run.data.metrics
    arts = {a.path for a in client().list_artifacts(run.info.run_id)}
    assert {"manifest.json", "validation", "evaluation", "training"} <= arts
    # The per-epoch curves: a PNG in the run folder (the summary names it), the same bytes as an
    # MLflow artifact of the run and as the Prefect image artifact "training-curves" (a data URL).
    png = s["plots"]["training_curves"]
    assert png.endswith("/plots/training_curves.png") and s["mlflow_run_id"] in png
    body = open(png, "rb").read()
    assert body.startswith(b"\x89PNG\r\n\x1a\n")
    assert [a.path for a in client().list_artifacts(run.info.run_id, "plots")] == ["plots/training_curves.png"]
    assert open(client().download_artifacts(run.info.run_id, "plots/training_curves.png", str(tmp_path)),
                "rb").read() == body
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        published = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["training-curves"])))
    mine = [a for a in published if png in (a.description or "")]
    assert len(mine) == 1 and mine[0].type == "image"
    assert base64.b64decode(mine[0].data.removeprefix("data:image/png;base64,")) == body
    # Training's progress, followed while it ran: the Prefect progress artifact ends at 100 %,
    # updated at least twice (the first movement and the end), each update also a log line.
    assert_progress_artifact(s["prefect_flow_run_id"])
    # MLflow lineage: the splits as datasets (digest: the DVC md5, source: the file at the data's
    # git rev), the test metrics on the version's LoggedModel, system metrics, the final stage.
    rev = s["manifest"]["data"]["rev"]
    datasets = {d.dataset.name: (d.dataset.digest, d.dataset.source, {t.key: t.value for t in d.tags}["mlflow.data.context"])
                for d in run.inputs.dataset_inputs}
    assert datasets == {"train": (dvc_md5, f"dvc://data/digits/train.csv@{rev}", "training"),
                        "test": (dvc_md5, f"dvc://data/digits/test.csv@{rev}", "testing")}
    logged = client().get_logged_model(mv.source.removeprefix("models:/"))
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [{"name": "digits-classifier", "version": "1"}]
    linked = {m.key: m.value for m in logged.metrics}
    assert {k: linked[f"test/{k}"] for k in s["metrics"]} == pytest.approx(s["metrics"])
    assert "system/cpu_utilization_percentage" in run.data.metrics
    assert not [k for k in linked if k.startswith("system/")]  # the run's, not the model's
    assert run.data.tags["trainflow.stage"] == "done"
    assert not monitor_threads()  # the system metrics monitor ended with the run


def test_a_transient_mlflow_error_after_training_is_retried_and_keeps_the_trained_model(first_run, state,
                                                                                      training_log_faults):
    code, s = first_run
    assert [f.rsplit("/", 1)[-1] for f in training_log_faults] == ["result.json"]  # the fault fired once
    assert code == 0 and s["status"] == "registered", s.get("error")
    # The model registered is the one trained: its folder was kept (claimed) for the retry, and
    # only the logging was repeated (the job's result logged once, not a second training).
    train_dir = s["train_dir"]
    assert json.loads(open(f"{train_dir}/result.json").read())["weights_sha256"] == s["training"]["weights_sha256"]
    assert client().get_model_version("digits-classifier", s["model_version"]).tags["weights_sha256"] == \
        s["training"]["weights_sha256"]
    assert [a.path for a in client().list_artifacts(s["mlflow_run_id"], "training")] == ["training/result.json"]
    assert len(client().get_metric_history(s["mlflow_run_id"], "train/wall_s")) == 1


def test_champion_loads_with_pyfunc_and_scores_the_test_split(first_run, state, bundled_data):
    import mlflow.pyfunc

    assert first_run[0] == 0
    test = pd.read_csv(bundled_data / "test.csv")
    model = mlflow.pyfunc.load_model("models:/digits-classifier@champion")
    pred = np.asarray(model.predict(test.drop(columns=["label"])))
    assert pred.shape == (len(test),)
    accuracy = float((pred == test["label"].to_numpy()).mean())
    assert accuracy == pytest.approx(first_run[1]["metrics"]["accuracy"], abs=1e-9)


def test_worse_candidate_is_rejected_and_champion_stays(first_run, state, tmp_path, capsys):
    assert first_run[0] == 0
    before = str(client().get_model_version_by_alias("digits-classifier", "champion").version)
    n_versions = len(client().search_model_versions("name='digits-classifier'"))
    code, s = run_cli(["--set", "training.epochs=1", "--set", "training.lr=0.00001",
                       "--set", "training.timeout_s=240"], tmp_path)
    assert code == 3 and s["status"] == "rejected" and s["exit_code"] == 3
    failed = {g["name"] for g in s["gates"] if not g["passed"]}
    # Every reason is listed: the absolute thresholds and the champion comparison.
    assert {"accuracy", "macro_f1", "accuracy_vs_champion", "macro_f1_vs_champion"} <= failed
    assert s["champion"]["version"] == before
    assert s["champion"]["scores"] == "recorded"  # v1 recorded its scores on this very test split
    assert str(client().get_model_version_by_alias("digits-classifier", "champion").version) == before
    assert len(client().search_model_versions("name='digits-classifier'")) == n_versions
    assert "gate rejected the candidate" in capsys.readouterr().err
    assert client().get_run(s["mlflow_run_id"]).info.status == "FAILED"
    assert client().get_run(s["mlflow_run_id"]).data.tags["trainflow.stage"] == "rejected"


def _stages_in_order(s: dict, order: list[str]) -> dict:
    """The run's completed Prefect task runs by stage name, each ending before the next starts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as prefect:
        runs = prefect.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[s["prefect_flow_run_id"]])))
    by_name = {r.name.rsplit("-", 1)[0]: r for r in runs if r.state and r.state.is_completed()}
    assert set(order) <= set(by_name), sorted(by_name)
    for before, after in zip(order, order[1:]):
        assert by_name[before].end_time <= by_name[after].start_time, (before, after)
    return by_name


def test_the_prefect_graph_tells_the_truth_train_starts_after_validate_ends(first_run):
    """What the Prefect UI draws: each stage a task run, in the DAG's order, none overlapping the next."""
    code, s = first_run
    assert code == 0
    by_name = _stages_in_order(s, ["resolve", "validate", "train", "evaluate", "gate", "register"])
    assert "measure" not in by_name  # a concrete layout: nothing to measure
    # The torchrun job itself was made (job.json) only once validation had passed.
    from datetime import datetime, timezone
    from pathlib import Path

    made = datetime.fromtimestamp((Path(s["train_dir"]) / "job.json").stat().st_mtime, tz=timezone.utc)
    assert made >= by_name["validate"].end_time


def test_corrupted_data_stops_at_validation_and_registers_nothing(make_project, state, tmp_path, capfd):
    def corrupt(train, test):
        train.loc[3, "pixel_10"] = None
        train.loc[5, "pixel_20"] = 99
        test.loc[0, "label"] = 12

    proj = make_project(corrupt)
    capfd.readouterr()
    jobs_before = set(state.glob("train/*/job.json"))
    code, s = run_cli(["--config", str(proj / "configs" / "digits.yaml"),
                       "--set", "registry.model_name=corrupt-digits"], tmp_path)
    assert code == 2 and s["status"] == "validation_failed"
    # What the user sees: each failure in one line, the report, one error line; no traceback at all
    # (not Prefect's for the task's exception, not torchrun's).
    err = capfd.readouterr().err
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    assert "  FAILED  train.pixel_10: 1 null value (row 3)\n" in err
    assert "  FAILED  test.label: 1 value not in the class set {0..9}: 12 ×1 (row 0)\n" in err
    assert s["validation"]["report"].endswith("validation/summary.md") and f"report        {s['validation']['report']}" in err
    failures = s["validation"]["failures"]
    named = {(f["split"], f["expectation"], f["column"]) for f in failures}
    assert ("train", "expect_column_values_to_not_be_null", "pixel_10") in named
    assert ("train", "expect_column_pair_values_a_to_be_greater_than_b", "pixel_20") in named  # above its max
    assert any(f["split"] == "test" and f["column"] == "label" for f in failures)
    assert "training" not in s  # stopped before training
    assert client().get_run(s["mlflow_run_id"]).data.tags["trainflow.stage"] == "validation_failed"
    assert not monitor_threads()
    assert client().search_model_versions("name='corrupt-digits'") == []
    assert not (state / "runs" / s["mlflow_run_id"] / "train").exists()
    # No torchrun job was made or started for data that failed validation.
    assert set(state.glob("train/*/job.json")) == jobs_before
    assert processes_mentioning(str(state / "train")) == []


def test_bad_config_exits_1_naming_the_key_path(repo_root, tmp_path):
    out = tmp_path / "s.json"
    proc = subprocess.run([str(VENV_BIN / "trainflow"), "run", "--set", "training.lr=-1",
                           "--summary-json", str(out)], cwd=repo_root, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert "training.lr: must be > 0, got -1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(out.read_text())["status"] == "config_error"


def test_preempted_training_exits_4_and_the_next_run_resumes(first_run, state, tmp_path, monkeypatch):
    # Both ranks get SIGTERM at step 30, as the launcher forwards a preemption notice.
    # Two epochs of 21 steps: the stop at step 30 is in the second.
    args = [*QUICK, "--set", "registry.model_name=preempt-digits"]
    monkeypatch.setenv("TRAINFLOW_FAULT", "sigterm@step=30")
    code, s = run_cli(args, tmp_path)
    assert code == 4 and s["status"] == "preempted" and s["exit_code"] == 4
    assert client().get_run(s["mlflow_run_id"]).data.tags["trainflow.stage"] == "preempted: train"
    assert client().search_model_versions("name='preempt-digits'") == []
    monkeypatch.delenv("TRAINFLOW_FAULT")
    first = s["mlflow_run_id"]
    code, s = run_cli(args, tmp_path)
    assert code == 0 and s["status"] == "registered"
    assert s["training"]["resumed_from_step"] == 30
    # One MLflow run for the one training: the resumed run goes on in the preempted one, whose
    # history holds both attempts' metrics, each step once.
    assert s["mlflow_run_id"] == first
    run = client().get_run(first)
    assert run.info.status == "FINISHED" and run.data.tags["trainflow.stage"] == "done"
    for key in ("perf/samples_per_s", "rank/1/compute_ms", "system/cpu_utilization_percentage"):
        steps = [m.step for m in client().get_metric_history(first, key)]
        assert len(steps) == len(set(steps)), f"{key}: a step twice"
    steps = sorted(m.step for m in client().get_metric_history(first, "perf/samples_per_s"))
    assert steps[0] <= 30 < steps[-1]
    # The goodput ledger spans both jobs: the preempted one checkpointed at its stop, so no step
    # was repeated and nothing died; the hour a rerun may wait is not wall time.
    g = s["training"]["goodput"]
    assert (g["failures"], g["lost_steps"], g["restart_s"]) == (0, 0, 0) and 0 < g["goodput"] < 1


def test_auto_layout_with_nothing_measured_is_probed_only_after_validation(first_run, state, repo_root, tmp_path):
    # strategy and cpu_workers auto, no sweep saved for this config: the probe's torchrun jobs are
    # training, so they run in `measure`, after `validate` ended; the manifest and the job follow
    # the layout it measured fastest.
    from datetime import datetime, timezone
    from pathlib import Path

    from core.config import load_config
    from training.plan import choose_layout, load_sweep, sweep_path

    sets = [*QUICK, "--set", "training.strategy=auto", "--set", "training.cpu_workers=auto",
            "--set", "registry.model_name=auto-digits"]
    cfg = load_config(repo_root / QUICK_CONFIG, sets[3::2])
    assert load_sweep(state, cfg) is None
    code, s = run_cli(sets, tmp_path)
    assert code == 0, s.get("error")
    stages = _stages_in_order(s, ["resolve", "validate", "measure", "train", "evaluate", "gate", "register"])
    rows = load_sweep(state, cfg)
    assert sorted((r["nproc"], r["threads"]) for r in rows) == [(1, 1), (1, 2), (2, 1)]
    probed = datetime.fromtimestamp(sweep_path(state, cfg).stat().st_mtime, tz=timezone.utc)
    assert stages["validate"].end_time <= probed <= stages["measure"].end_time
    best = choose_layout(rows)
    world = s["manifest"]["world"]
    assert (world["nproc_per_node"], world["nnodes"]) == (best["nproc"], 1)
    assert s["training"]["world_size"] == best["nproc"]
    assert s["training"]["strategy"] == ("single" if best["nproc"] == 1 else "ddp")
    made = datetime.fromtimestamp((Path(s["train_dir"]) / "job.json").stat().st_mtime, tz=timezone.utc)
    assert made >= stages["measure"].end_time
    # MLflow holds the measured plan, written once: parameters and manifest tags are the job's.
    run = client().get_run(s["mlflow_run_id"])
    assert run.data.params["training.cpu_workers"] == str(best["nproc"])
    assert run.data.tags["nproc_per_node"] == str(best["nproc"])
