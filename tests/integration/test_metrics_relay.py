"""registry.relay against a real sqlite MLflow store: rank 0's metrics file relayed into a run."""

from __future__ import annotations

import json
import logging

import pytest

from core.metrics_file import METRICS_FILE, MetricsWriter, metrics_record, params_record
from tests import waiting
from training.sink import RUN_ID_ENV, MetricsSink

pytestmark = pytest.mark.integration

WAIT_S = 60  # a busy box; the relay passes every 50 ms here


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A sqlite store in a temporary folder; the global URIs and env are put back after."""
    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID",
                     RUN_ID_ENV):
            mp.delenv(name, raising=False)
        mp.chdir(root)
        from registry.store import configure

        yield configure(f"sqlite:///{root / 'mlflow.db'}", "relay-test", root / "artifacts")
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


@pytest.fixture
def run_id(experiment):
    from registry.store import start_run

    return start_run(experiment, "relay", {})


def history(run_id, key):
    from registry.store import client

    return sorted((m.step, m.value, m.timestamp) for m in client().get_metric_history(run_id, key))


def wait_for(predicate):
    waiting.wait_for(predicate, WAIT_S, "the relay to log", poll_s=0.05)


def test_relay_logs_live_and_completely_with_the_workers_steps_and_times(run_id, tmp_path):
    from registry.relay import relay_metrics
    from registry.store import client

    path = tmp_path / METRICS_FILE
    sink = MetricsSink.for_rank(True, tmp_path)
    with relay_metrics(run_id, path, interval_s=0.05) as relay:
        sink.params({"global_batch": 64, "strategy": "ddp"})
        sink.metrics({"perf/samples_per_s": 100.0}, step=1)
        wait_for(lambda: len(history(run_id, "perf/samples_per_s")) == 1)  # while the "job" runs
        for step in range(2, 6):
            sink.metrics({"perf/samples_per_s": 100.0 * step, "perf/straggler": 0.0}, step=step)
        with open(path, "a") as f:  # the job's last line, cut short: not a record yet
            f.write('{"time_ms":1,"step":99,"metrics":{"perf/samples_per_s":')
    sink.finish()

    written = [json.loads(line) for line in path.read_text().splitlines()[:-1]]
    expected = [(r["step"], r["metrics"]["perf/samples_per_s"], r["time_ms"]) for r in written if "metrics" in r]
    assert history(run_id, "perf/samples_per_s") == expected  # each once, with the worker's step and time
    assert [s for s, _, _ in history(run_id, "perf/straggler")] == [2, 3, 4, 5]
    assert client().get_run(run_id).data.params == {"train.global_batch": "64", "train.strategy": "ddp"}
    assert relay.logged == {"params": 2, "metrics": 9} and relay.dropped == 0
    # The partial line is left where the next reader starts.
    assert relay.offset == len(path.read_bytes()) - len(path.read_text().splitlines()[-1])


def test_records_of_an_earlier_job_in_the_folder_are_not_relayed_again(run_id, tmp_path):
    from registry.relay import relay_metrics

    path = tmp_path / METRICS_FILE
    earlier = MetricsWriter(path)  # an interrupted job; its own pipeline run logged these
    earlier.write(metrics_record({"train/val_loss": 9.0}, 1, 1000))
    earlier.close()
    with relay_metrics(run_id, path, interval_s=0.05):
        resumed = MetricsWriter(path)
        resumed.write(metrics_record({"train/val_loss": 0.5}, 2, 2000))
        resumed.close()
    assert history(run_id, "train/val_loss") == [(2, 0.5, 2000)]


def test_a_restarted_worker_repeats_its_params_and_big_passes_are_split(run_id, tmp_path):
    from registry.relay import relay_metrics
    from registry.store import client

    path = tmp_path / METRICS_FILE
    w = MetricsWriter(path)
    params = {f"train.p{i}": str(i) for i in range(150)}  # more than one log_batch may hold
    w.write(params_record(params, 1000))
    for step in range(1, 1301):  # 2600 metrics in one pass: three batches
        w.write(metrics_record({"a": step, "b": -step}, step, 1000 + step))
    w.write(params_record(params, 5000))  # torchrun restarted the group: the same params again
    w.close()
    with relay_metrics(run_id, path, interval_s=0.05, start=0) as relay:
        pass
    assert relay.dropped == 0 and relay.logged == {"params": 150, "metrics": 2600}
    assert client().get_run(run_id).data.params == params
    assert [s for s, _, _ in history(run_id, "a")] == list(range(1, 1301))
    assert history(run_id, "b")[-1] == (1300, -1300.0, 2300)


def test_an_mlflow_error_is_a_warning_and_never_fails_the_block(experiment, tmp_path, caplog):
    from registry.relay import relay_metrics

    path = tmp_path / METRICS_FILE
    w = MetricsWriter(path)
    w.write(metrics_record({"m": 1.0}, 1, 1000))
    w.close()
    with caplog.at_level(logging.WARNING, logger="registry.relay"):
        with relay_metrics("0" * 32, path, interval_s=0.05, start=0) as relay:  # no such run
            pass
    assert relay.dropped == 1 and relay.logged["metrics"] == 0
    assert "dropped" in caplog.text and "0" * 32 in caplog.text


def test_the_blocks_own_error_passes_through_after_the_last_pass(run_id, tmp_path):
    from registry.relay import relay_metrics

    path = tmp_path / METRICS_FILE
    with pytest.raises(RuntimeError, match="worker failed"):
        with relay_metrics(run_id, path, interval_s=60):  # no pass before the block ends
            w = MetricsWriter(path)
            w.write(metrics_record({"m": 7.0}, 3, 3000))
            w.close()
            raise RuntimeError("worker failed")
    assert history(run_id, "m") == [(3, 7.0, 3000)]  # what the job logged before it failed is kept


def test_a_resumed_relay_into_the_recorded_run_sends_each_record_and_step_once(run_id, tmp_path, monkeypatch):
    from core.metrics_file import read_run_record
    from registry.relay import relay_metrics

    path = tmp_path / METRICS_FILE
    record = (tmp_path, "cfg-1")
    w = MetricsWriter(path)
    with relay_metrics(run_id, path, interval_s=0.05, record=record):
        for step in (1, 2, 3):
            w.write(metrics_record({"m": float(step)}, step, 1000 + step))
    assert read_run_record(tmp_path)["relayed_bytes"] == path.stat().st_size
    # The job wrote on after that relay's last pass (the pipeline was killed; the job stopped).
    w.write(metrics_record({"m": 4.0}, 4, 1004))
    w.close()
    # A restarted attempt repeats step 4 (after its checkpoint at 3), then goes on.
    with relay_metrics(run_id, path, interval_s=0.05, record=record) as relay:
        w = MetricsWriter(path)
        for step in (4, 5):
            w.write(metrics_record({"m": 40.0 + step}, step, 2000 + step))
        w.close()
    assert history(run_id, "m") == [(1, 1.0, 1001), (2, 2.0, 1002), (3, 3.0, 1003), (4, 4.0, 1004), (5, 45.0, 2005)]
    assert relay.skipped == 1
    # Another run's relay into the same folder starts at the end: the first run's records stay there.
    from registry.store import start_run

    other = start_run(client_experiment(run_id), "other", {})
    with relay_metrics(other, path, interval_s=0.05, record=record):
        pass
    assert history(other, "m") == [] and read_run_record(tmp_path)["run_id"] == other


def client_experiment(run_id):
    from registry.store import client

    return client().get_run(run_id).info.experiment_id


def test_a_sink_resumes_the_run_its_folder_records_and_skips_steps_the_run_has(run_id, tmp_path, monkeypatch, caplog):
    from registry.store import client

    monkeypatch.setenv(RUN_ID_ENV, run_id)
    first = MetricsSink.for_rank(True, tmp_path, "cfg-1")
    first.params({"world_size": 2})
    for step in (1, 2, 3):
        first.metrics({"m": float(step)}, step)
    first.finish()
    monkeypatch.delenv(RUN_ID_ENV)
    # The resumed attempt repeats step 3 (its checkpoint was at 2) and goes on.
    again = MetricsSink.for_rank(True, tmp_path, "cfg-1")
    assert again.run_id == run_id
    for step in (3, 4):
        again.metrics({"m": 10.0 + step}, step)
    again.finish()
    assert [(s, v) for s, v, _ in history(run_id, "m")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0)]
    tags = client().get_run(run_id).data.tags
    assert tags["trainflow.training.config_id"] == "cfg-1"
    # Another config in the same folder: the recorded run is not its run; MLflow stays unused.
    with caplog.at_level(logging.WARNING, logger="trainflow.train"):
        assert MetricsSink.for_rank(True, tmp_path, "cfg-2").run_id is None
    assert "trainflow.training.config_id" in caplog.text
    # An empty run id (the pipeline's jobs: it relays) never resumes one.
    monkeypatch.setenv(RUN_ID_ENV, "")
    assert MetricsSink.for_rank(True, tmp_path, "cfg-1").run_id is None
