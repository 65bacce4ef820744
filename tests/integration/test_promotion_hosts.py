"""Promotion across hosts: two promoters, each with its own TRAINFLOW_HOME (so no file they could
share), against one real ``mlflow server`` (sqlite backend in a temp folder), promote at once.
The better model must hold ``@champion`` whichever of them decides last."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, VENV_BIN
from tests.integration.live import Proc, assert_the_better_promotion_won, clean_env, team_script, wait_http
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SCORES = {"1": {"accuracy": 0.90, "macro_f1": 0.90}, "2": {"accuracy": 0.97, "macro_f1": 0.97},
          "3": {"accuracy": 0.93, "macro_f1": 0.93}}

# One promoter, as the pipeline's register stage promotes: its own home, the lock the pipeline
# takes, and a decision that (for v3) takes as long as rescoring a champion would.
PROMOTER = """
import json, sys, time
from pathlib import Path

import mlflow

uri, home, version, go, scores = sys.argv[1], Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), json.loads(sys.argv[5])
mlflow.set_tracking_uri(uri)
mlflow.set_registry_uri(uri)
from evaluation.gates import beats
from flows.pipeline import promotion_lock
from registry.models import promote_if
from tasks import get_task

task = get_task("classification")


def deserves(current):
    if version == "3":
        time.sleep(1.5)
    return beats(task, scores[version], scores[current["version"]] if current else None)


home.mkdir(parents=True, exist_ok=True)
(home / "ready").write_text("ready")
while not go.exists():
    time.sleep(0.01)
print(json.dumps(promote_if("race", version, deserves, promotion_lock(uri, home, "race"))))
"""


@pytest.fixture
def mlflow_server(tmp_path):
    """A real ``mlflow server`` on 127.0.0.1 with a sqlite backend and served artifacts in tmp_path."""
    port = team_script().free_port()
    url = f"http://127.0.0.1:{port}"
    server = Proc([str(VENV_BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
                   "--serve-artifacts", "--artifacts-destination", str(tmp_path / "artifacts"),
                   "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                  clean_env(MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),  # no job runner: 6 fewer processes
                  tmp_path, tmp_path / "mlflow.log")
    try:
        wait_http(f"{url}/health", server, timeout=180)
        yield url
    finally:
        server.stop()


def test_two_homes_promoting_at_once_through_one_server_leave_the_better_model_champion(mlflow_server, tmp_path):
    """v2 (better) and v3 (worse, slower to decide) both beat champion v1. Without a lock both
    homes share, both decide against v1 and the slower one, v3, is written last."""
    from mlflow import MlflowClient

    url = mlflow_server
    c = MlflowClient(url, url)
    c.create_registered_model("race")
    run_id = c.create_run("0").info.run_id
    for _ in range(3):  # the alias logic needs versions, not model files
        c.create_model_version("race", f"runs:/{run_id}/model", run_id=run_id)
    c.set_registered_model_alias("race", "champion", "1")

    go = tmp_path / "go"
    procs = {}
    for version in ("2", "3"):
        home = tmp_path / f"home-{version}"
        env = clean_env(MLFLOW_TRACKING_URI=url, TRAINFLOW_HOME=home, PYTHONPATH=ROOT,
                        MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
        procs[version] = (home, subprocess.Popen(
            [sys.executable, "-c", PROMOTER, url, str(home), version, str(go), json.dumps(SCORES)],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    def both_ready() -> bool:
        assert all(p.poll() is None for _, p in procs.values()), \
            "\n".join(p.stderr.read()[-3000:] for _, p in procs.values() if p.poll() is not None)
        return all((home / "ready").exists() for home, _ in procs.values())

    wait_for(both_ready, 120, "both promoters to be ready", poll_s=0.05)
    go.write_text("go")
    results = {}
    for version, (_, proc) in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        results[version] = json.loads(out.strip().splitlines()[-1])

    assert_the_better_promotion_won(c, results)
    # Every ticket was returned: the next promoter waits for no one.
    assert [mv.version for mv in c.search_model_versions("name = 'race.promotion-lock'")] == []

