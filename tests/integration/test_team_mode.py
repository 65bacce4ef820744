"""Team mode: the pipeline against an `mlflow server` and a `prefect server`, both on PostgreSQL.

The servers come from the same command a user runs (`make team-up` = scripts/team.py up),
each on a free port of 127.0.0.1, PostgreSQL in a temp folder; `team.py down` stops them all.
"""

from __future__ import annotations

import json
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

OVERRIDES = ["training.epochs=3", "training.timeout_s=240", "gates.thresholds={accuracy: 0.8, macro_f1: 0.8, min_class_recall: 0.5, latency_p95_ms: 5000}"]

# MLFLOW_TRACKING_URI alone points MLflow (tracking and registry) at the server.
LOAD_CHAMPION = """
import json, sys
import pandas as pd
from registry import models
predictor = models.load_predictor("digits-classifier", "champion")
test = pd.read_csv(sys.argv[1])
accuracy = float((predictor(test.drop(columns=["label"])) == test["label"].to_numpy()).mean())
print(json.dumps({"version": predictor.version, "accuracy": accuracy}))
"""


@pytest.fixture
def team(tmp_path):
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
    team_dir = tmp_path / "team"
    cmd = [sys.executable, str(ROOT / "scripts" / "team.py")]
    where = ["--dir", str(team_dir)]
    try:
        up = subprocess.run([*cmd, "up", *where, "--pg-dir", str(pg_parent / "pg"), "--pg-port", "0",
                             "--mlflow-port", "0", "--prefect-port", "0"],
                            env=clean_env(), capture_output=True, text=True, timeout=400)
        assert up.returncode == 0, f"team.py up failed:\n{up.stderr[-4000:]}"
        env = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        yield {"env": env, "dir": team_dir, "state": json.loads((team_dir / "team.json").read_text())}
    finally:
        down = subprocess.run([*cmd, "down", *where], env=clean_env(), capture_output=True, text=True, timeout=180)
        leftover = team_dir / "team.json"
        if leftover.is_file():  # down failed: stop what it recorded anyway, then fail loudly
            state = json.loads(leftover.read_text())
            for pid in state["pids"].values():
                team_mod.stop_group(pid, grace=5)
            if state.get("pg"):
                team_mod.pg_down(state["pg"])
            pytest.fail(f"team.py down left servers behind:\n{down.stderr}")
        shutil.rmtree(pg_parent, ignore_errors=True)


def test_pipeline_runs_against_mlflow_and_prefect_servers_on_postgres(team, make_project, tmp_path):
    import psycopg2
    from mlflow import MlflowClient

    mlflow_url, prefect_api = team["env"]["MLFLOW_TRACKING_URI"], team["env"]["PREFECT_API_URL"]
    assert mlflow_url.startswith("http://127.0.0.1:") and prefect_api.startswith("http://127.0.0.1:")
    proj = make_project()
    home = tmp_path / "home"
    summary_file = tmp_path / "summary.json"
    args = [str(VENV_BIN / "trainflow"), "run", "--summary-json", str(summary_file)]
    for o in OVERRIDES:
        args += ["--set", o]
    proc = subprocess.run(args, cwd=proj, capture_output=True, text=True, timeout=400,
                          env=clean_env(MLFLOW_TRACKING_URI=mlflow_url, PREFECT_API_URL=prefect_api,
                                        TRAINFLOW_HOME=home))
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "registered" and summary["tracking_uri"] == mlflow_url
    assert summary["model_version"] == "1" and set(summary["aliases"]) == {"challenger", "champion"}

    # Everything went through the servers: no local MLflow database or artifact folder was made.
    assert not (home / "mlflow.db").exists() and not (home / "mlartifacts").exists()
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
                           capture_output=True, text=True, timeout=180, env=clean_env(MLFLOW_TRACKING_URI=mlflow_url))
    assert check.returncode == 0, check.stderr[-3000:]
    loaded = json.loads(check.stdout.splitlines()[-1])
    assert loaded["version"] == "1"
    assert loaded["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-9)
    model_id = client.get_model_version("digits-classifier", "1").source.removeprefix("models:/")
    assert list(served.glob(f"*/models/{model_id}/artifacts/MLmodel"))

    # Both servers keep their records in PostgreSQL.
    pg_port = team["state"]["pg"]["port"]
    with psycopg2.connect(host="127.0.0.1", port=pg_port, user="trainflow", dbname="mlflow") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT version FROM model_versions WHERE name = %s", ("digits-classifier",))
            assert [str(v) for (v,) in cur.fetchall()] == ["1"]
    conn.close()
    with psycopg2.connect(host="127.0.0.1", port=pg_port, user="trainflow", dbname="prefect") as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT state_type FROM flow_run")
            assert [str(state) for (state,) in cur.fetchall()] == ["COMPLETED"]
    conn.close()
    # ... and answer through their APIs as well.
    flow_runs = httpx.post(f"{prefect_api}/flow_runs/filter", json={}, timeout=10).json()
    assert [r["state"]["type"] for r in flow_runs] == ["COMPLETED"]
