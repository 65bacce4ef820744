"""Team mode: the pipeline against an `mlflow server` and a `prefect server`, both on PostgreSQL,
all three behind the team's passwords.

The servers come from the same command a user runs (`make team-up` = scripts/team.py up),
each on a free port of 127.0.0.1, PostgreSQL in a temp folder; `team.py down` stops them all.
One team-up serves the whole module (it takes 30-60 s).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, VENV_BIN
from tests.integration.live import clean_env, team_script

pytestmark = pytest.mark.integration

CONFIG = "tests/configs/team.yaml"  # three epochs clear its gates

# MLFLOW_TRACKING_URI and the two credential variables point MLflow (tracking and registry) at the server.
LOAD_CHAMPION = """
import json, sys
import pandas as pd
from registry import models
predictor = models.load_predictor("digits-classifier", "champion")
test = pd.read_csv(sys.argv[1])
accuracy = float((predictor(test.drop(columns=["label"])) == test["label"].to_numpy()).mean())
print(json.dumps({"version": predictor.version, "accuracy": accuracy}))
"""


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    team_mod = team_script()
    try:
        team_mod.pg_bindir()
        team_mod.pg_runas()
    except team_mod.TeamError as exc:
        pytest.skip(f"team mode needs a PostgreSQL server install: {exc}")
    # As root, PostgreSQL runs as `postgres`, which must reach its folder: pytest's tmp_path
    # sits under a folder only root may enter, so the cluster gets its own temp folder.
    pg_parent = Path(tempfile.mkdtemp(prefix="trainflow-pg-"))
    pg_parent.chmod(0o711)
    team_dir = tmp_path_factory.mktemp("team") / "team"
    cmd = [sys.executable, str(ROOT / "scripts" / "team.py")]
    where = ["--dir", str(team_dir)]
    try:
        up = subprocess.run([*cmd, "up", *where, "--pg-dir", str(pg_parent / "pg"), "--pg-port", "0",
                             "--mlflow-port", "0", "--prefect-port", "0"],
                            env=clean_env(), capture_output=True, text=True, timeout=400)
        assert up.returncode == 0, f"team.py up failed:\n{up.stderr[-4000:]}"
        # What `eval "$(make -s team-up)"` leaves in a user's shell.
        shell = subprocess.run(["bash", "-c", 'eval "$1" && env -0', "_", up.stdout], capture_output=True,
                               text=True, env={"PATH": os.environ["PATH"]}, check=True)
        env = dict(item.split("=", 1) for item in shell.stdout.split("\0") if "=" in item)
        team_env = {k: v for k, v in env.items() if k.startswith(("MLFLOW_", "PREFECT_"))}
        secrets_file = team_dir / "secrets.json"
        secrets = json.loads(secrets_file.read_text()) if secrets_file.is_file() else {}
        yield {"env": team_env, "dir": team_dir, "pg_dir": pg_parent / "pg", "secrets": secrets, "up": up,
               "state": json.loads((team_dir / "team.json").read_text())}
    finally:
        down = subprocess.run([*cmd, "down", *where], env=clean_env(), capture_output=True, text=True, timeout=180)
        leftover = team_dir / "team.json"
        if leftover.is_file():  # down failed: stop what it recorded anyway, then fail loudly
            state = json.loads(leftover.read_text())
            for name, pid in state["pids"].items():
                team_mod.stop_group(pid, state.get("identity", {}).get(name), grace=5)
            if state.get("pg"):
                team_mod.pg_down(state["pg"])
            pytest.fail(f"team.py down left servers behind:\n{down.stderr}")
        shutil.rmtree(pg_parent, ignore_errors=True)


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _secret_values(team) -> list[str]:
    s = team["secrets"]
    return [s["postgres_password"], s["mlflow_password"], s["mlflow_flask_secret_key"],
            s["prefect_auth_string"].partition(":")[2]]


def test_wrong_password_is_refused_by_each_server(team):
    import psycopg2

    secrets, env = team["secrets"], team["env"]
    pg_port = team["state"]["pg"]["port"]
    # PostgreSQL: no trust rule left, over TCP or the unix socket; a wrong password and none are refused.
    for kw in ({"password": "wrong"}, {}):
        with pytest.raises(psycopg2.OperationalError, match="password authentication failed|no password supplied"):
            psycopg2.connect(host="127.0.0.1", port=pg_port, user="trainflow", dbname="mlflow", connect_timeout=10, **kw)
    socket_dir = str(team["pg_dir"] / "run")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(host=socket_dir, port=pg_port, user="trainflow", dbname="mlflow", password="wrong")
    psycopg2.connect(host="127.0.0.1", port=pg_port, user="trainflow", dbname="mlflow",
                     password=secrets["postgres_password"]).close()

    # MLflow's basic-auth app: 401 without the admin password, 200 with it.
    search = f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1"
    for headers in ({}, _basic("trainflow", "wrong"), _basic("admin", "password1234")):
        assert httpx.get(search, headers=headers, timeout=30).status_code == 401, headers
    ok = _basic(env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    assert httpx.get(search, headers=ok, timeout=30).status_code == 200

    # Prefect: the API answers 401 to a wrong auth string; health stays open for probes.
    flows = f"{env['PREFECT_API_URL']}/flows/filter"
    for headers in ({}, _basic("trainflow", "wrong")):
        assert httpx.post(flows, json={}, headers=headers, timeout=30).status_code == 401, headers
    user, _, password = env["PREFECT_API_AUTH_STRING"].partition(":")
    assert httpx.post(flows, json={}, headers=_basic(user, password), timeout=30).status_code == 200
    assert httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=30).status_code == 200


MLFLOW_APIS = [("GET", "/api/2.0/mlflow/experiments/search?max_results=1"),
               ("GET", "/api/2.0/mlflow/registered-models/search"),
               ("GET", "/api/2.0/mlflow/model-versions/search"),
               ("GET", "/api/2.0/mlflow/registered-models/alias?name=digits-classifier&alias=champion"),
               ("POST", "/api/2.0/mlflow/registered-models/alias"),
               ("POST", "/api/2.0/mlflow/runs/create"),
               ("POST", "/api/3.0/mlflow/logged-models/search"),
               ("GET", "/api/2.0/mlflow/users/get?username=trainflow"),
               ("GET", "/api/2.0/mlflow-artifacts/artifacts"),
               ("GET", "/ajax-api/2.0/mlflow/experiments/search?max_results=1"),
               ("GET", "/get-artifact?path=MLmodel&run_uuid=0"),
               ("GET", "/model-versions/get-artifact?path=MLmodel&name=digits-classifier&version=1"),
               ("POST", "/graphql")]
PREFECT_APIS = [("POST", f"/{what}/filter") for what in ("flows", "deployments", "flow_runs", "task_runs",
                                                          "work_pools", "logs", "artifacts", "variables",
                                                          "block_documents")] + [
    ("GET", "/admin/settings"), ("GET", "/admin/version"), ("POST", "/deployments/"), ("POST", "/flow_runs/"),
    ("POST", "/work_pools/")]


def test_no_api_of_either_server_answers_without_credentials(team):
    """Every kind of request a client makes, reads and writes, to both servers, with no credentials (and
    to Prefect with wrong ones): 401 each (only Prefect's /health stays open for probes). MLflow checks a
    wrong password with a deliberately slow hash before any route: one route shows it, in
    test_wrong_password_is_refused_by_each_server."""
    env = team["env"]
    mlflow_url, prefect_api = env["MLFLOW_TRACKING_URI"], env["PREFECT_API_URL"]
    answered = []
    wrong = _basic("trainflow", "wrong")
    for base, apis, tries in ((mlflow_url, MLFLOW_APIS, ({},)), (prefect_api, PREFECT_APIS, ({}, wrong))):
        for headers in tries:
            for method, path in apis:
                code = httpx.request(method, base + path, headers=headers, timeout=30,
                                     **({"json": {}} if method == "POST" else {})).status_code
                if code != 401:
                    answered.append((base + path, method, bool(headers), code))
    assert answered == []


def test_a_user_with_credentials_for_one_model_cannot_move_another_model_s_champion(team):
    """``team.py user alice --model model-a``: alice moves model-a's @champion, and is refused (403) moving
    or deleting model-b's, or registering a version of it; model-b's champion stays where it was."""
    env, team_dir = team["env"], team["dir"]
    url = env["MLFLOW_TRACKING_URI"]
    admin = _basic(env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    made = subprocess.run([sys.executable, str(ROOT / "scripts" / "team.py"), "user", "alice", "--model", "model-a",
                           "--dir", str(team_dir)], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    alice_file = team_dir / "users" / "alice.env"
    assert alice_file.stat().st_mode & 0o777 == 0o600
    alice_env = dict(line.removeprefix("export ").split("=", 1) for line in alice_file.read_text().splitlines()
                     if line.startswith("export "))
    password = alice_env["MLFLOW_TRACKING_PASSWORD"].strip("'")
    assert alice_env["MLFLOW_TRACKING_USERNAME"] == "alice" and password not in made.stdout + made.stderr
    alice = _basic("alice", password)

    def api(method: str, path: str, headers: dict, **body) -> httpx.Response:
        return httpx.request(method, f"{url}/api/2.0/mlflow/{path}", headers=headers, timeout=30,
                             **({"params": body} if method == "GET" else {"json": body}))

    experiment = api("POST", "experiments/create", admin, name="permissions").json()["experiment_id"]
    run_id = api("POST", "runs/create", admin, experiment_id=experiment).json()["run"]["info"]["run_id"]
    assert api("POST", "registered-models/create", admin, name="model-b").status_code == 200
    for model in ("model-a", "model-b"):
        for _ in range(2):
            made = api("POST", "model-versions/create", admin, name=model, source=f"runs:/{run_id}/model",
                       run_id=run_id)
            assert made.status_code == 200, made.text
        assert api("POST", "registered-models/alias", admin, name=model, alias="champion", version="1").status_code == 200

    assert api("POST", "registered-models/alias", alice, name="model-a", alias="champion", version="2").status_code == 200
    assert api("POST", "registered-models/alias", alice, name="model-b", alias="champion", version="2").status_code == 403
    assert api("DELETE", "registered-models/alias", alice, name="model-b", alias="champion").status_code == 403
    assert api("POST", "model-versions/create", alice, name="model-b", source=f"runs:/{run_id}/model",
               run_id=run_id).status_code == 403
    champions = {m: api("GET", "registered-models/alias", admin, name=m, alias="champion").json()["model_version"]
                 for m in ("model-a", "model-b")}
    assert {m: v["version"] for m, v in champions.items()} == {"model-a": "2", "model-b": "1"}


def test_secrets_stay_in_owner_only_files_and_off_command_lines(team):
    for name in ("secrets.json", "env.sh"):
        assert (team["dir"] / name).stat().st_mode & 0o777 == 0o600, name
    values = _secret_values(team)
    assert not [v for v in values if v in team["up"].stdout + team["up"].stderr]
    # Every local user can read a process's command line: the servers got their secrets by environment.
    for name, pid in team["state"]["pids"].items():
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert cmdline and not [v for v in values if v in cmdline], name


def test_pipeline_runs_against_mlflow_and_prefect_servers_on_postgres(team, make_project, tmp_path, monkeypatch):
    import psycopg2
    from mlflow import MlflowClient

    mlflow_url, prefect_api = team["env"]["MLFLOW_TRACKING_URI"], team["env"]["PREFECT_API_URL"]
    assert mlflow_url.startswith("http://127.0.0.1:") and prefect_api.startswith("http://127.0.0.1:")
    proj = make_project()
    home = tmp_path / "home"
    summary_file = tmp_path / "summary.json"
    args = [str(VENV_BIN / "trainflow"), "run", "--config", CONFIG, "--summary-json", str(summary_file)]
    proc = subprocess.run(args, cwd=proj, capture_output=True, text=True, timeout=400,
                          env=clean_env(**team["env"], TRAINFLOW_HOME=home))
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "registered" and summary["tracking_uri"] == mlflow_url
    assert summary["model_version"] == "1" and set(summary["aliases"]) == {"challenger", "champion"}

    # Everything went through the servers: no local MLflow database or artifact folder was made.
    assert not (home / "mlflow.db").exists() and not (home / "mlartifacts").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", team["env"]["MLFLOW_TRACKING_USERNAME"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", team["env"]["MLFLOW_TRACKING_PASSWORD"])
    client = MlflowClient(tracking_uri=mlflow_url, registry_uri=mlflow_url)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
    served = team["dir"] / "mlartifacts"
    assert list(served.glob(f"*/{run.info.run_id}/artifacts/manifest.json")), "artifacts did not reach the server"
    # Rank 0 of torchrun logged per-epoch metrics over HTTP into the pipeline's run.
    losses = client.get_metric_history(run.info.run_id, "train/train_loss")
    assert sorted(m.step for m in losses) == [1, 2, 3]

    # A consumer in another process, given only the URL, loads the champion through the server.
    check = subprocess.run([sys.executable, "-c", LOAD_CHAMPION, str(proj / "data" / "digits" / "test.csv")],
                           capture_output=True, text=True, timeout=180,
                           env=clean_env(**{k: v for k, v in team["env"].items() if k.startswith("MLFLOW_")}))
    assert check.returncode == 0, check.stderr[-3000:]
    loaded = json.loads(check.stdout.splitlines()[-1])
    assert loaded["version"] == "1"
    assert loaded["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-9)
    model_id = client.get_model_version("digits-classifier", "1").source.removeprefix("models:/")
    assert list(served.glob(f"*/models/{model_id}/artifacts/MLmodel"))

    # Both servers keep their records in PostgreSQL.
    pg_port = team["state"]["pg"]["port"]
    pg = dict(host="127.0.0.1", port=pg_port, user="trainflow", password=team["secrets"]["postgres_password"])
    with psycopg2.connect(**pg, dbname="mlflow") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT version FROM model_versions WHERE name = %s", ("digits-classifier",))
            assert [str(v) for (v,) in cur.fetchall()] == ["1"]
    conn.close()
    with psycopg2.connect(**pg, dbname="prefect") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT state_type FROM flow_run")
            assert [str(state) for (state,) in cur.fetchall()] == ["COMPLETED"]
    conn.close()
    # ... and answer through their APIs as well.
    user, _, password = team["env"]["PREFECT_API_AUTH_STRING"].partition(":")
    prefect_auth = _basic(user, password)
    flow_runs = httpx.post(f"{prefect_api}/flow_runs/filter", json={}, headers=prefect_auth, timeout=10).json()
    assert [r["state"]["type"] for r in flow_runs] == ["COMPLETED"]

    # No secret was written into a log, an artifact, a Prefect record or an MLflow param or tag.
    values = _secret_values(team)
    assert not [v for v in values if v in proc.stdout + proc.stderr]
    leaks = []
    for root in (proj, home, team["dir"], team["pg_dir"] / "postgres.log"):
        for path in [root, *root.rglob("*")]:
            # the owner-only credential files (secrets.json, env.sh, users/NAME.env; modes checked above)
            if path.is_file() and path.name not in ("secrets.json", "env.sh") and path.parent.name != "users":
                data = path.read_bytes()
                leaks += [str(path) for v in values if v.encode() in data]
    assert not leaks
    recorded = json.dumps([run.data.params, run.data.tags,
                           httpx.post(f"{prefect_api}/logs/filter", json={}, headers=prefect_auth, timeout=30).json(),
                           httpx.post(f"{prefect_api}/artifacts/filter", json={}, headers=prefect_auth,
                                      timeout=30).json()])
    assert '"message"' in recorded and not [v for v in values if v in recorded]
