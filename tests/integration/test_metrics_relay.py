"""registry.relay against a real sqlite MLflow store: rank 0's metrics file relayed into a run."""

from __future__ import annotations

import json
import logging
import time

import pytest

from core.metrics_file import METRICS_FILE, MetricsWriter, metrics_record, params_record
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
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, "the relay did not log within the wait"
        time.sleep(0.05)


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
