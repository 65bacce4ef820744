"""Two pipeline runs at once: distinct model versions, separate training folders, and a
``@champion`` that only a better candidate can take, even when promotions race."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from tests.conftest import VENV_BIN
from tests.integration.live import assert_the_better_promotion_won

pytestmark = pytest.mark.integration

# Two epochs, loose gates; one training process per run (a torchrun agent and one worker): two
# runs at once on a 2-core box start four torch processes, not six, and what is raced here (the
# registry, the training folders, the promotion) does not depend on the world size.
FAST = ["--config", "tests/configs/digits-quick.yaml", "--set", "training.cpu_workers=1",
        "--set", "training.strategy=single"]


def test_two_runs_at_once_get_their_own_versions_and_training_folders(make_project, tmp_path, prefect_api):
    """Two ``trainflow run`` processes with the same inputs, started together on one state folder
    (one MLflow sqlite registry) and one Prefect server."""
    from prefect.settings import PREFECT_API_URL

    proj = make_project()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(TRAINFLOW_HOME=str(home), PREFECT_API_URL=PREFECT_API_URL.value())
    procs = []
    for i in range(2):
        out = tmp_path / f"summary{i}.json"
        cmd = [str(VENV_BIN / "trainflow"), "run", *FAST, "--set", "registry.model_name=race-digits",
               "--summary-json", str(out)]
        procs.append((subprocess.Popen(cmd, cwd=proj, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True), out))
    summaries = []
    for proc, out in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        summaries.append(json.loads(out.read_text()))
    a, b = summaries
    assert {a["model_version"], b["model_version"]} == {"1", "2"}
    dirs = sorted([a["train_dir"], b["train_dir"]])
    assert dirs[1] == dirs[0] + ".1"  # one took the folder of these inputs, the other the next slot
    # Same inputs, deterministic CPU training: the two candidates are the same model.
    assert a["training"]["weights_sha256"] == b["training"]["weights_sha256"]
    assert a["mlflow_run_id"] != b["mlflow_run_id"]
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri=a["tracking_uri"], registry_uri=a["tracking_uri"])
    champ = str(c.get_model_version_by_alias("race-digits", "champion").version)
    assert champ in {"1", "2"}
    # Whichever promoted second saw the other as champion, and a tie goes to the newer one.
    assert [s["promotion"]["promoted"] for s in summaries].count(True) >= 1
    assert all(s["promotion"]["confirmed"] for s in summaries)
    # Both folders hold a completed job (the next identical run resumes nothing and starts fresh).
    for s in summaries:
        assert json.loads(open(os.path.join(s["train_dir"], "result.json")).read())["status"] == "completed"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A real MLflow sqlite registry with a champion v1 and two candidates v2 (better) and v3 (worse)."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    c = MlflowClient()
    c.create_registered_model("race")
    for _ in range(3):  # the alias logic needs versions, not model files
        c.create_model_version("race", source=str(tmp_path / "model"))
    c.set_registered_model_alias("race", "champion", "1")
    scores = {"1": {"accuracy": 0.90, "macro_f1": 0.90}, "2": {"accuracy": 0.97, "macro_f1": 0.97},
              "3": {"accuracy": 0.93, "macro_f1": 0.93}}
    from flows.pipeline import promotion_lock

    return c, scores, lambda: promotion_lock(uri, tmp_path, "race")


@pytest.mark.parametrize("slow", ["2", "3"])
def test_racing_promotions_never_let_a_worse_candidate_replace_a_better_champion(registry, slow):
    """v2 and v3 both beat v1. They promote at the same moment; the one named ``slow`` takes
    longer to decide (as scoring a model would). Without the lock both decide against v1 and
    the last writer wins, whichever it is; with it, v3 must find v2 and stay out."""
    from evaluation.gates import beats
    from registry.models import promote_if
    from tasks import get_task

    task = get_task("classification")
    c, scores, lock = registry  # lock(): the lock the pipeline takes, a fresh context per promoter
    start = threading.Barrier(2)
    results = {}

    def candidate(version):
        def deserves(current):
            if version == slow:
                time.sleep(0.5)
            return beats(task, scores[version], scores[current["version"]] if current else None)

        start.wait()
        results[version] = promote_if("race", version, deserves, lock())

    threads = [threading.Thread(target=candidate, args=(v,)) for v in ("2", "3")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert_the_better_promotion_won(c, results)
