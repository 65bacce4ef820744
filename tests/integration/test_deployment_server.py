"""prefect.yaml against a real `prefect server start`: deploy, run through the API, a process worker runs it."""

from __future__ import annotations

import json
import subprocess
import time
from zoneinfo import ZoneInfo

import httpx
import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN
from tests.integration.live import Proc, clean_env, copy_repo, team_script, wait_flow_run, wait_http

pytestmark = pytest.mark.integration

# Small and deterministic (seed 0): three epochs clear these gates with room to spare.
OVERRIDES = ["training.epochs=3", "training.timeout_s=240", "gates.thresholds={accuracy: 0.8, macro_f1: 0.8, min_class_recall: 0.5, latency_p95_ms: 5000}"]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A real Prefect server on 127.0.0.1 (its own sqlite database under a temp PREFECT_HOME), shared by
    this module's tests. Its scheduler looks for due schedules every 2 s instead of every 60 s."""
    tmp_path = tmp_path_factory.mktemp("prefect-server")
    port = team_script().free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = clean_env(PREFECT_HOME=tmp_path / "prefect-home", PREFECT_UI_ENABLED="false",
                    PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS=2)
    server = Proc([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                  env, tmp_path, tmp_path / "prefect-server.log")
    try:
        wait_http(f"{api}/health", server, timeout=180)
        yield api
    finally:
        server.stop()


def prefect_cli(args: list[str], env: dict, cwd) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(VENV_BIN / "prefect"), "--no-prompt", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_train_deployment_runs_on_a_process_worker_and_registers_a_version(prefect_server, tmp_path):
    from mlflow import MlflowClient

    api = prefect_server
    repo = copy_repo(tmp_path / "repo")
    assert not (repo / "data" / "digits").exists()  # the deployment's pull step must fetch it
    home = tmp_path / "home"
    env = clean_env(PREFECT_API_URL=api, PREFECT_HOME=tmp_path / "client-home", TRAINFLOW_REPO_DIR=repo,
                    TRAINFLOW_HOME=home, PREFECT_WORKER_QUERY_SECONDS=1, PREFECT_WORKER_PREFETCH_SECONDS=5)
    spec = yaml.safe_load((repo / "prefect.yaml").read_text())
    pool = next(d for d in spec["deployments"] if d["name"] == "train")["work_pool"]["name"]

    prefect_cli(["work-pool", "create", pool, "--type", "process", "--overwrite"], env, repo)
    prefect_cli(["deploy", "--name", "train"], env, repo)

    deployment = httpx.get(f"{api}/deployments/name/trainflow-pipeline/train", timeout=10).json()
    assert deployment["work_pool_name"] == pool
    assert deployment["enforce_parameter_schema"] is True
    assert "PipelineParams" in json.dumps(deployment["parameter_openapi_schema"])
    # `prefect deploy` fills TRAINFLOW_REPO_DIR into the pull step: the worker needs no such variable.
    assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(repo)
    # The form rejects what the schema forbids, before any worker sees it.
    bad = httpx.post(f"{api}/deployments/{deployment['id']}/create_flow_run",
                     json={"parameters": {"params": {"nproc_per_node": 0}}}, timeout=10)
    assert bad.status_code == 409, bad.text

    # What the UI's "Run" button sends: a flow run created from the deployment with the form's values.
    created = httpx.post(f"{api}/deployments/{deployment['id']}/create_flow_run",
                         json={"parameters": {"params": {"overrides": OVERRIDES}}}, timeout=10)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    worker = Proc([str(VENV_BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process", "--limit", "1"],
                  {k: v for k, v in env.items() if k != "TRAINFLOW_REPO_DIR"}, tmp_path, tmp_path / "worker.log")
    try:
        run = wait_flow_run(api, run_id, timeout=420, worker=worker)
    finally:
        worker.stop()  # before the server (a worker outliving its server lingers ~30 s)
    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{worker.tail(80)}"
    assert run["work_pool_name"] == pool
    assert run["parameters"]["params"]["overrides"] == OVERRIDES

    # The worker ran the flow inside the deployed checkout (pull step: set_working_directory, dvc pull).
    assert (repo / "data" / "digits" / "train.csv").is_file()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()

    uri = f"sqlite:///{home / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    versions = client.search_model_versions("name='digits-classifier'")
    assert [str(v.version) for v in versions] == ["1"]
    version = versions[0]
    assert version.tags["git_sha"] == head and version.tags["git_dirty"] == "false"
    assert {"champion", "challenger"} <= set(client.get_registered_model("digits-classifier").aliases)
    mlflow_run = client.get_run(version.run_id)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["training.epochs"] == "3"


def test_retrain_nightly_is_deployed_with_its_schedule_and_the_server_plans_runs_from_it(request, tmp_path):
    from datetime import datetime, timedelta, timezone

    from cronsim import CronSim

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    nightly = next((d for d in spec["deployments"] if d["name"] == "retrain-nightly"), None)
    if nightly is None or not (ROOT / nightly["entrypoint"].split(":")[0]).is_file():
        pytest.skip("prefect.yaml's retrain-nightly deployment or its flow file is not on this branch yet")
    api = request.getfixturevalue("prefect_server")  # started only when there is something to deploy
    repo = copy_repo(tmp_path / "repo")
    env = clean_env(PREFECT_API_URL=api, PREFECT_HOME=tmp_path / "client-home", TRAINFLOW_REPO_DIR=repo)
    (declared,) = nightly["schedules"]
    pool = nightly["work_pool"]["name"]
    before = datetime.now(timezone.utc)

    prefect_cli(["work-pool", "create", pool, "--type", "process", "--overwrite"], env, repo)
    prefect_cli(["deploy", "--name", "retrain-nightly"], env, repo)

    found = httpx.post(f"{api}/deployments/filter",
                       json={"deployments": {"name": {"any_": ["retrain-nightly"]}}}, timeout=10).json()
    assert len(found) == 1
    deployment = found[0]
    assert deployment["entrypoint"] == nightly["entrypoint"] and deployment["work_pool_name"] == pool
    assert not deployment["paused"]
    (schedule,) = deployment["schedules"]
    assert schedule["active"] is True
    assert schedule["schedule"]["cron"] == declared["cron"]
    assert schedule["schedule"]["timezone"] == declared.get("timezone", "UTC")

    # The server's scheduler turns the cron into upcoming runs of this deployment, on its pool.
    deadline = time.monotonic() + 60
    planned = []
    while time.monotonic() < deadline and not planned:
        planned = httpx.post(f"{api}/flow_runs/filter", timeout=10, json={
            "deployments": {"id": {"any_": [deployment["id"]]}},
            "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}).json()
        time.sleep(1)
    assert planned, "the scheduler planned no run of retrain-nightly within 60 s"
    tz = ZoneInfo(declared.get("timezone", "UTC"))
    for run in planned:
        start = datetime.fromisoformat(run["expected_start_time"]).astimezone(tz)
        assert start > before
        # each planned start is a firing time of the declared cron expression
        assert next(CronSim(declared["cron"], start - timedelta(seconds=1))) == start
        assert run["work_pool_name"] == pool
