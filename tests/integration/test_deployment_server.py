"""prefect.yaml against a real `prefect server start`: deploy, run through the API, a process worker runs it."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import uuid
from zoneinfo import ZoneInfo

import httpx
import pytest
import yaml

from tests.conftest import ROOT, VENV_BIN
from tests.integration.live import (TERMINAL, Proc, call, clean_env, copy_repo, marked_processes, team_script,
                                    wait_flow_run, wait_http)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# A run may only choose a committed config and set training knobs: the smoke config (committed in
# the deployed checkout) holds gates that three epochs clear with room to spare (seed 0).
SMOKE = "digits-smoke.yaml"
PARAMS = {"config": SMOKE, "epochs": 3}
MARK = "TRAINFLOW_TEST_RUN_MARK"
GRACE_S = 60  # Prefect's own grace (30 s) before it kills the flow-run process, plus the config's preempt_grace_s
SECRET = ["label,SECRET_COLUMN_4711,pixel_0", "3,SECRET_VALUE_0815,1.5"]


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


@pytest.fixture(scope="module")
def deployed(prefect_server, tmp_path_factory):
    """``prefect deploy --name train`` from a fresh copy of this checkout (plus the committed smoke
    config): ``(api, repo, deployment, pool, env)``. The data is not pulled yet."""
    api = prefect_server
    tmp_path = tmp_path_factory.mktemp("deployed")
    repo = copy_repo(tmp_path / "repo")
    assert not (repo / "data" / "digits").exists()  # the deployment's pull step must fetch it
    smoke = yaml.safe_load((repo / "configs" / "digits.yaml").read_text())
    smoke["training"]["timeout_s"] = 240
    smoke["gates"]["thresholds"] = {"accuracy": 0.8, "macro_f1": 0.8, "min_class_recall": 0.5, "latency_p95_ms": 5000}
    (repo / "configs" / SMOKE).write_text(yaml.safe_dump(smoke, sort_keys=False))
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "smoke config"], cwd=repo,
                   check=True)
    env = clean_env(PREFECT_API_URL=api, PREFECT_HOME=tmp_path / "client-home", TRAINFLOW_REPO_DIR=repo,
                    PREFECT_WORKER_QUERY_SECONDS=1, PREFECT_WORKER_PREFETCH_SECONDS=5)
    spec = yaml.safe_load((repo / "prefect.yaml").read_text())
    pool = next(d for d in spec["deployments"] if d["name"] == "train")["work_pool"]["name"]
    locked = subprocess.run([str(VENV_BIN / "trainflow"), "pool", "create", pool, "--allow-env", MARK,
                             "--home-root", str(tmp_path_factory.getbasetemp())], cwd=repo, env=env,
                            capture_output=True, text=True, timeout=120)
    assert locked.returncode == 0, locked.stdout + locked.stderr
    prefect_cli(["deploy", "--name", "train"], env, repo)
    deployment = get(f"{api}/deployments/name/trainflow-pipeline/train", timeout=10).json()
    return api, repo, deployment, pool, env


def get(url: str, **kw) -> httpx.Response:
    return call("GET", url, **kw)


def post(url: str, **kw) -> httpx.Response:
    return call("POST", url, **kw)


def delete(url: str, **kw) -> httpx.Response:
    return call("DELETE", url, **kw)


@pytest.fixture(scope="module")
def worker(deployed, tmp_path_factory):
    """One guarded process worker (``trainflow worker``, ``--limit 1``) serving the deployed checkout,
    shared by the tests that run the deployment: a worker start costs seconds, and each flow run is its
    own process anyway. Each run gets its TRAINFLOW_HOME (inside the worker's --home-root, pytest's temp
    folder) and, where it needs one, a marker (which this worker allows) through its job variables
    (``run_on_worker``), which the process worker puts into that run's environment only. Stopped
    before the server (a worker outliving its server lingers ~30 s)."""
    _, repo, _, pool, env = deployed
    tmp_path = tmp_path_factory.mktemp("worker")
    worker_env = {k: v for k, v in env.items() if k != "TRAINFLOW_REPO_DIR"}
    proc = Proc([str(VENV_BIN / "trainflow"), "worker", "--pool", pool, "--limit", "1", "--allow-env", MARK,
                 "--home-root", str(tmp_path_factory.getbasetemp())],
                {**worker_env, "TRAINFLOW_HOME": str(tmp_path / "home")}, repo, tmp_path / "worker.log")
    try:
        yield proc
    finally:
        # Every run it took is over by now; on SIGTERM it still lingers the whole grace (20 s here), so
        # 5 s, then SIGKILL to its group (nothing of a run is left in it to lose).
        proc.stop(grace=5)


def run_on_worker(api: str, deployment: dict, params: dict, home, enforce: bool = True, **env) -> httpx.Response:
    """Create a flow run of ``deployment`` (what the UI's "Run" button sends) whose process sees
    TRAINFLOW_HOME=``home`` and ``env``."""
    body = {"parameters": {"params": params},
            "job_variables": {"env": {"TRAINFLOW_HOME": str(home), **{k: str(v) for k, v in env.items()}}}}
    if not enforce:
        body["enforce_parameter_schema"] = False
    return post(f"{api}/deployments/{deployment['id']}/create_flow_run", json=body)


def test_train_deployment_runs_on_a_process_worker_and_registers_a_version(deployed, worker, tmp_path):
    from mlflow import MlflowClient

    api, repo, deployment, pool, env = deployed
    home = tmp_path / "home"
    assert deployment["work_pool_name"] == pool
    assert deployment["enforce_parameter_schema"] is True
    assert "PipelineParams" in json.dumps(deployment["parameter_openapi_schema"])
    # `prefect deploy` fills TRAINFLOW_REPO_DIR into the pull step: the worker needs no such variable.
    assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(repo)
    # The form rejects what the schema forbids, before any worker sees it.
    bad = post(f"{api}/deployments/{deployment['id']}/create_flow_run",
                     json={"parameters": {"params": {"nproc_per_node": 0}}}, timeout=10)
    assert bad.status_code == 409, bad.text

    # What the UI's "Run" button sends: a flow run created from the deployment with the form's values.
    created = run_on_worker(api, deployment, PARAMS, home)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    run = wait_flow_run(api, run_id, timeout=420, worker=worker)
    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{worker.tail(80)}"
    assert run["work_pool_name"] == pool
    assert run["parameters"]["params"] == PARAMS

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
    # It promoted under the server's global concurrency limit (flows/promotion.py), free again now.
    limit = get(f"{api}/v2/concurrency_limits/promote-digits-classifier", timeout=10)
    assert limit.status_code == 200, limit.text
    assert limit.json()["limit"] == 1 and limit.json()["active_slots"] == 0
    mlflow_run = client.get_run(version.run_id)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["training.epochs"] == "3"


def test_a_run_pointing_the_dataset_outside_the_repository_is_refused_and_leaks_nothing(deployed, worker, tmp_path):
    """The reproduced leak: overrides pointing dataset.path and its files at a CSV outside the repository put
    its header into artifacts, logs and .trainflow/. Now the server refuses such a run, and a flow run created
    with the schema check switched off (any API caller may ask for that) is refused by the worker guard,
    which checks the parameters against the flow's own signature, before any process of it starts."""
    api, repo, deployment, pool, env = deployed
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("\n".join(SECRET) + "\n")
    leak = {"overrides": [f"dataset.path={outside}", "dataset.train_file=secret.csv", "dataset.test_file=secret.csv",
                          "dataset.expectations_file=null"]}
    url = f"{api}/deployments/{deployment['id']}/create_flow_run"
    for params, key in ((leak, "overrides"), ({"config": f"../../{outside.name}/secret.yaml"}, "config"),
                        ({"config": str(outside / "x.yaml")}, "config")):
        refused = post(url, json={"parameters": {"params": params}}, timeout=10)
        assert refused.status_code == 409 and key in refused.text, refused.text

    home = tmp_path / "home"
    created = run_on_worker(api, deployment, leak, home, enforce=False)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    run = wait_flow_run(api, run_id, timeout=300, worker=worker)
    logs: list[dict] = []

    def refusal_logged() -> bool:  # the flow run's last log lines reach the server after its final state
        logs[:] = post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}}, timeout=10).json()
        return any("not a run parameter" in e["message"] for e in logs)

    wait_for(refusal_logged, 30, "the guard's refusal in the flow run's logs", poll_s=1)
    assert run["state"]["type"] == "FAILED", f"{run['state']}\n{worker.tail(80)}"
    assert run["state"]["message"].startswith("Refused by the trainflow worker guard: parameters: ")
    assert any("overrides: not a run parameter" in e["message"] for e in logs), [e["message"] for e in logs]
    artifacts = post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}},
                           timeout=10).json()
    assert not [a for a in artifacts if a.get("key")]  # no stage's report (Prefect may keep the error itself)
    task_runs = post(f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}, timeout=10).json()
    assert task_runs == []  # not even resolve ran
    seen = [json.dumps(run), json.dumps(logs), json.dumps(artifacts), worker.log.read_text(errors="replace")]
    for folder in (home, repo / ".trainflow", worker.log.parent / "home"):  # the run's, the checkout's, the worker's
        seen += [p.read_bytes().decode(errors="replace") for p in folder.rglob("*") if p.is_file()]
    for needle in (*SECRET, "SECRET_COLUMN_4711", "SECRET_VALUE_0815"):  # its lines and distinctive words
        assert not any(needle in text for text in seen), needle


def test_cancelling_a_deployment_run_mid_training_leaves_no_process_of_it(deployed, worker, tmp_path):
    """A Prefect cancellation (the UI's "Cancel") of a run that is training: the worker SIGTERMs the flow-run
    process's group, the launcher asks the workers to checkpoint and stop, and torchrun and its workers are gone
    within the grace period (measured here: ~9 s). Were Prefect to escalate to SIGKILL, PR_SET_PDEATHSIG takes
    the agent and its workers down instead (tests/fault/test_orphans.py)."""
    api, repo, deployment, pool, env = deployed
    marker = uuid.uuid4().hex
    created = run_on_worker(api, deployment, {"config": SMOKE, "epochs": 500}, tmp_path / "home", **{MARK: marker})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    def of_run() -> dict[int, str]:  # every process of the run: all that carry its marker (the worker has none)
        return {pid: cmd for pid, cmd in marked_processes(MARK, marker).items()
                if pid != worker.popen.pid and "worker start" not in cmd}

    try:
        # Training: the agent and its 2 workers, each with "training.worker" in its command line (an exec'd
        # worker's own; a forked one's is its agent's, ``python -m training.agent ... -m training.worker ...``).
        def training_started() -> bool:
            state = get(f"{api}/flow_runs/{run_id}", timeout=10).json()["state"]["type"]
            assert state not in TERMINAL, f"{state} before training\n{worker.tail()}"
            return sum("training.worker" in cmd for cmd in of_run().values()) >= 3

        wait_for(training_started, 240, f"the run's agent and 2 workers\n{worker.tail()}", poll_s=1)
        training = of_run()
        cancel = post(f"{api}/flow_runs/{run_id}/set_state",
                            json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True}, timeout=10)
        assert cancel.status_code in (200, 201) and cancel.json()["status"] == "ACCEPT", cancel.text
        run = wait_flow_run(api, run_id, timeout=90, worker=worker)
        with contextlib.suppress(AssertionError):  # what is left after the grace is named below
            wait_for(lambda: not of_run(), GRACE_S, "the cancelled run's processes to end", poll_s=0.5)
        left = of_run()
    finally:
        for pid in of_run():  # only ever needed where the cancelled run left processes behind
            os.kill(pid, signal.SIGKILL)
    assert run["state"]["type"] == "CANCELLED", f"{run['state']}\n{worker.tail(80)}"
    assert left == {}, f"alive {GRACE_S} s after the cancelled run ended: {left}\n(training was {training})"


@pytest.fixture(scope="module")
def deployed_all(deployed):
    """``prefect deploy --all`` from the deployed checkout, once for the two tests that look at its deployments:
    ``(pools before it, when it started)``."""
    from datetime import datetime, timezone

    api, repo, _, _, env = deployed
    pools = [p["name"] for p in post(f"{api}/work_pools/filter", json={}, timeout=10).json()]
    before = datetime.now(timezone.utc)
    prefect_cli(["deploy", "--all"], env, repo)
    return pools, before


def test_retrain_nightly_is_deployed_with_its_schedule_and_the_server_plans_runs_from_it(request):
    from datetime import datetime, timedelta

    from cronsim import CronSim

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    nightly = next((d for d in spec["deployments"] if d["name"] == "retrain-nightly"), None)
    if nightly is None or not (ROOT / nightly["entrypoint"].split(":")[0]).is_file():
        pytest.skip("prefect.yaml's retrain-nightly deployment or its flow file is not on this branch yet")
    # Deployed by `prefect deploy --all` from the module's checkout (started only when there is something to deploy).
    api = request.getfixturevalue("deployed")[0]
    _, before = request.getfixturevalue("deployed_all")
    (declared,) = nightly["schedules"]
    pool = nightly["work_pool"]["name"]

    found = post(f"{api}/deployments/filter",
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
    planned = wait_for(lambda: post(f"{api}/flow_runs/filter", timeout=10, json={
        "deployments": {"id": {"any_": [deployment["id"]]}},
        "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}).json(),
        60, "the scheduler to plan a run of retrain-nightly", poll_s=1)
    tz = ZoneInfo(declared.get("timezone", "UTC"))
    for run in planned:
        start = datetime.fromisoformat(run["expected_start_time"]).astimezone(tz)
        assert start > before
        # each planned start is a firing time of the declared cron expression
        assert next(CronSim(declared["cron"], start - timedelta(seconds=1))) == start
        assert run["work_pool_name"] == pool


def test_deploy_all_needs_only_the_process_pool(deployed, deployed_all):
    """`prefect deploy --all` on a server that has only the `process` pool (this module's) creates every
    deployment of prefect.yaml (the GPU ones live in deploy/gpu.prefect.yaml). An unset variable stopping
    it: tests/integration/test_prefect_yaml.py."""
    api, repo, _, pool, env = deployed
    pools_before, _ = deployed_all  # it ran `prefect deploy --all` (and succeeded) with these pools
    assert pools_before == [pool]
    pools = post(f"{api}/work_pools/filter", json={}, timeout=10).json()
    assert [p["name"] for p in pools] == [pool]  # and created none
    names = [d["name"] for d in yaml.safe_load((repo / "prefect.yaml").read_text())["deployments"]]
    found = post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": names}}}, timeout=10).json()
    assert sorted(d["name"] for d in found) == sorted(names)
    for dep in found:
        assert dep["work_pool_name"] == pool
        assert dep["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(repo)


def _evil_code(tmp_path) -> tuple:
    """A folder with a ``sitecustomize.py`` that leaves a marker when any Python process imports it,
    and the markers each request would leave: ``(folder, env marker, command marker, pull marker)``."""
    evil = tmp_path / "evil"
    evil.mkdir()
    markers = tuple(tmp_path / f"ran-{what}" for what in ("env", "command", "pull"))
    (evil / "sitecustomize.py").write_text(f"open({str(markers[0])!r}, 'w').write('ran')\n")
    return (evil, *markers)


def _evil_deployment(api: str, deployment: dict, pool: str, marker) -> dict:
    """What any caller of the open-source server's API may do: a new deployment of the same flow on the
    same pool, whose pull step (run inside the flow-run process) is a shell command."""
    created = post(f"{api}/deployments/", json={
        "name": "evil", "flow_id": deployment["flow_id"], "entrypoint": deployment["entrypoint"],
        "work_pool_name": pool,
        "pull_steps": [{"prefect.deployments.steps.run_shell_script": {"script": f"touch {marker}"}}]})
    assert created.status_code in (200, 201), created.text
    return created.json()


def test_the_guarded_worker_runs_nothing_a_caller_brings(deployed, worker, tmp_path):
    """The three requests that ran a caller's program on a plain process worker: a run's own PYTHONPATH,
    a run's own command, and a deployment created through the API with a shell pull step. Each ends
    Failed with a one-line reason naming the field (the UI shows the state message), and leaves its
    marker absent."""
    api, repo, deployment, pool, env = deployed
    evil, env_marker, command_marker, pull_marker = _evil_code(tmp_path)
    url = f"{api}/deployments/{deployment['id']}/create_flow_run"
    requests = {
        "env": (post(url, json={"parameters": {"params": PARAMS}, "job_variables": {"env": {"PYTHONPATH": str(evil)}}}),
                "job variable env.PYTHONPATH is not allowed in a flow run"),
        "command": (post(url, json={"parameters": {"params": PARAMS},
                                    "job_variables": {"command": f"touch {command_marker}"}}),
                    "job variable 'command' is not allowed in a flow run"),
        "pull": (post(f"{api}/deployments/{_evil_deployment(api, deployment, pool, pull_marker)['id']}/create_flow_run",
                      json={}),
                 "deployment 'evil' is not in prefect.yaml"),
    }
    for what, (created, reason) in requests.items():
        assert created.status_code == 201, created.text
        run = wait_flow_run(api, created.json()["id"], timeout=120, worker=worker)
        assert run["state"]["type"] == "FAILED", f"{what}: {run['state']}\n{worker.tail(40)}"
        assert run["state"]["message"].startswith(f"Refused by the trainflow worker guard: {reason}"), what
    assert not any(m.exists() for m in (env_marker, command_marker, pull_marker))
    assert "Worker guard refused the run: deployment 'evil' is not in prefect.yaml" in worker.log.read_text()


def _scheduled_run(api: str, deployment_id: str, **body) -> dict:
    """A flow run that no worker takes (scheduled in 2099), for calling the guard by hand."""
    created = post(f"{api}/deployments/{deployment_id}/create_flow_run", json={
        **body, "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": "2099-01-01T00:00:00Z"}}})
    assert created.status_code == 201, created.text
    return created.json()


def test_the_locked_pool_s_command_refuses_on_its_own_where_a_plain_worker_serves_it(deployed, tmp_path):
    """Where a plain ``prefect worker`` (or a container) serves the locked pool, the run's process is
    the pool's fixed command: the guard runs first (``python -I``, so a run's PYTHONPATH imports nothing),
    refuses, and nothing of the run executes."""
    api, repo, deployment, pool, env = deployed
    template = get(f"{api}/work_pools/{pool}", timeout=10).json()["base_job_template"]
    command = shlex.split(template["job_configuration"]["command"])
    assert command[1:4] == ["-I", "-m", "flows.worker_guard"]
    evil, env_marker, _, pull_marker = _evil_code(tmp_path)
    for run, extra_env, reason in (
            (_scheduled_run(api, deployment["id"], parameters={"params": PARAMS},
                            job_variables={"env": {"PYTHONPATH": str(evil)}}), {"PYTHONPATH": str(evil)},
             "job variable env.PYTHONPATH is not allowed in a flow run"),
            (_scheduled_run(api, _evil_deployment(api, deployment, pool, pull_marker)["id"]), {},
             "deployment 'evil' is not in prefect.yaml")):
        # what the process worker starts: the pool's command, in the pool's directory, with the run's env merged
        proc = subprocess.run(command, cwd=template["job_configuration"]["working_dir"], capture_output=True,
                              text=True, timeout=120,
                              env={**env, **extra_env, "PREFECT__FLOW_RUN_ID": run["id"]})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert reason in proc.stderr and "Traceback" not in proc.stderr
        state = get(f"{api}/flow_runs/{run['id']}", timeout=10).json()["state"]
        assert state["type"] == "FAILED"
        assert state["message"].startswith(f"Refused by the trainflow worker guard: {reason}")
    assert not env_marker.exists() and not pull_marker.exists()


def test_every_committed_deployment_passes_the_guard_as_deployed(deployed, deployed_all):
    """``ci`` and ``retrain-nightly`` as ``prefect deploy --all`` stored them, with runs as the server
    makes them (the deployment's parameters), pass the same check the worker makes; ``train`` runs
    through it to completion above."""
    from flows.worker_guard import Guard

    api, repo, _, pool, env = deployed
    guard = Guard(repo, home_root=repo)
    names = sorted(guard.committed)
    found = post(f"{api}/deployments/filter", json={"deployments": {"name": {"any_": names}}}).json()
    assert sorted(d["name"] for d in found) == names
    for dep in found:
        run = _scheduled_run(api, dep["id"], job_variables={"env": {"TRAINFLOW_HOME": str(repo / ".trainflow")}})
        assert guard.check(run, dep) is None, dep["name"]
        assert delete(f"{api}/flow_runs/{run['id']}", timeout=10).status_code == 204


def test_a_guarded_worker_on_an_unlocked_pool_warns(deployed, tmp_path):
    """A pool made with ``prefect work-pool create`` runs whatever a run brings on a plain worker: the
    guarded worker says so when it starts (it still checks every run itself)."""
    from prefect.workers.process import ProcessWorker

    api, repo, _, _, env = deployed
    made = post(f"{api}/work_pools/", json={"name": "unlocked", "type": "process",
                                            "base_job_template": ProcessWorker.get_default_base_job_template()})
    assert made.status_code == 201, made.text
    proc = Proc([str(VENV_BIN / "trainflow"), "worker", "--pool", "unlocked"], env, repo, tmp_path / "worker.log")
    try:
        def warned() -> bool:
            assert proc.popen.poll() is None, proc.tail()
            return "is not locked" in proc.log.read_text()

        wait_for(warned, 90, "the worker's warning that the pool is not locked", poll_s=0.5)
        assert "work pool 'unlocked' is not locked: any caller of the Prefect API can run code" in proc.log.read_text()
    finally:
        proc.stop(grace=5)
    assert delete(f"{api}/work_pools/unlocked", timeout=10).status_code == 204
