"""One MLflow run for one training across preemption: real torchrun (2 CPU ranks), real sqlite store.

The pipeline's way (rank 0 writes metrics.jsonl, this process relays it with the folder's run
record) and ``trainflow train``'s way (rank 0 logs itself: the first attempt into the run
``TRAINFLOW_MLFLOW_RUN_ID`` names, the resumed one into the run its folder records). Each
training is preempted (the ``sigterm`` fault: the ranks agree, checkpoint and stop) and resumed.
"""

from __future__ import annotations

import json

import pytest

from core.errors import PreemptedError
from core.metrics_file import METRICS_FILE, RUN_FILE, read_records
from tests.engine_helpers import train
from training.sink import RUN_ID_ENV

pytestmark = pytest.mark.fault

# 2 epochs of 21 steps; the SIGTERM at step 5 is seen at the agreement check of step 10.
JOB = ["training.epochs=2", "training.log_every_steps=5"]
STOP = "sigterm@step=5"


@pytest.fixture(scope="module")
def store(tmp_path_factory, bundled_data):
    """``(experiment id, tracking URI)`` of a sqlite store; global URIs and env put back after."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
                     RUN_ID_ENV):
            mp.delenv(name, raising=False)
        from registry.store import configure

        yield configure(uri, "one-run", root / "artifacts"), uri
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


def steps_of(run_id: str, key: str) -> list[int]:
    from registry.store import client

    return [m.step for m in client().get_metric_history(run_id, key)]


def preempted_then_resumed(out, env_first: dict, env_second: dict, wrap) -> tuple[int, dict]:
    """Train into ``out`` until preempted, then resume it to the end; each attempt inside ``wrap()``."""
    with wrap():
        with pytest.raises(PreemptedError):
            train(out, JOB, env=env_first)
    stopped = json.loads((out / "result.json").read_text())["steps"]
    with wrap():
        final = train(out, JOB, env=env_second)
    assert final["status"] == "completed" and final["resumed_from_step"] == stopped
    return stopped, final


def assert_one_history(run_id: str, stopped: int, final: dict) -> None:
    """Each metric once per step, both attempts' steps in the run."""
    for key in ("perf/samples_per_s", "rank/0/compute_ms", "rank/1/compute_ms", "rank/1/allreduce_wait_ms"):
        steps = sorted(steps_of(run_id, key))
        assert len(steps) == len(set(steps)), f"{key}: a step logged twice: {steps}"
        assert steps[0] <= stopped < steps[-1], f"{key}: {steps} does not span the stop at step {stopped}"
        assert steps == list(range(5, final["steps"] + 1, 5))
    assert sorted(steps_of(run_id, "train/val_loss")) == [1, 2]  # the epochs, each once


def test_pipeline_relay_keeps_one_run_and_the_resumed_attempt_names_a_slow_rank(store, tmp_path):
    from contextlib import contextmanager

    from registry.relay import relay_metrics
    from registry.store import client, start_run

    exp_id, uri = store
    run_id = start_run(exp_id, "pipeline", {})
    out = tmp_path / "out"
    cid = None

    @contextmanager
    def relayed():
        nonlocal cid
        from core.config import load_config
        from tests.engine_helpers import ENGINE_CONFIG

        cid = cid or load_config(ENGINE_CONFIG, JOB).config_id()
        with relay_metrics(run_id, out / METRICS_FILE, interval_s=0.2, record=(out, cid)) as relay:
            yield relay

    # The pipeline's jobs: an empty run id, so rank 0 writes its file only and this process relays.
    # The resumed attempt has rank 1 sleeping 60 ms a step: a straggler under DDP's equal step times.
    stopped, final = preempted_then_resumed(
        out, {RUN_ID_ENV: "", "TRAINFLOW_FAULT": STOP},
        {RUN_ID_ENV: "", "TRAINFLOW_FAULT": "slow@step=1,rank=1,ms=60"}, relayed)
    assert_one_history(run_id, stopped, final)
    rec = json.loads((out / RUN_FILE).read_text())
    assert rec["run_id"] == run_id and rec["relayed_bytes"] == (out / METRICS_FILE).stat().st_size
    tags = client().get_run(run_id).data.tags
    assert tags["trainflow.training.config_id"] == cid

    # The detector, fed each rank's compute time, names rank 1 in the resumed attempt's windows.
    records, _ = read_records(out / METRICS_FILE, 0)
    windows = [r["metrics"] for r in records if "perf/straggler" in r.get("metrics", {}) and r["step"] > stopped]
    assert windows and all(w["perf/straggler"] == 1.0 and w["perf/straggler_rank"] == 1 for w in windows[1:])
    # Rank 0 is the one that waits: for this model (it has buffers) mostly in DDP's broadcast
    # before the forward, the rest in the gradient all-reduce.
    waited = [w["rank/0/allreduce_wait_ms"] + w["rank/0/forward_sync_ms"]
              - w["rank/1/allreduce_wait_ms"] - w["rank/1/forward_sync_ms"] for w in windows[1:]]
    assert all(d > 0 for d in waited), waited
    # (Not asserted: that the first attempt, with no slow rank, flags nobody. On this shared
    # 2-core box scheduler noise alone reached x1.5-1.7 for a window or two; the unit tests pin
    # the rule's threshold and noise floor on fixed inputs.)


def test_trainflow_train_resumes_logging_into_the_run_its_folder_records(store, tmp_path):
    from contextlib import nullcontext

    from registry.store import client, start_run

    exp_id, uri = store
    run_id = start_run(exp_id, "direct", {})
    out = tmp_path / "out"
    # First attempt: the run is named; the resumed one is not (a plain rerun into the same --out).
    stopped, final = preempted_then_resumed(
        out, {RUN_ID_ENV: run_id, "MLFLOW_TRACKING_URI": uri, "TRAINFLOW_FAULT": STOP},
        {"MLFLOW_TRACKING_URI": uri}, nullcontext)
    assert_one_history(run_id, stopped, final)
    assert client().get_run(run_id).data.params["train.world_size"] == "2"
    assert json.loads((out / RUN_FILE).read_text())["run_id"] == run_id
