"""Rank 0's metrics file: what the sink writes, and how a reader tails it from a byte offset."""

from __future__ import annotations

import json
import logging
import time

import pytest

from core.metrics_file import METRICS_FILE, MetricsWriter, file_size, metrics_record, read_records
from training.sink import RUN_ID_ENV, MetricsSink
from training.trainer import EpochStats


@pytest.fixture
def no_run(monkeypatch):
    monkeypatch.delenv(RUN_ID_ENV, raising=False)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rank0_sink_writes_params_and_metrics_as_json_lines(tmp_path, no_run):
    before = int(time.time() * 1000)
    sink = MetricsSink.for_rank(True, tmp_path)
    assert sink.run_id is None and sink.client is None  # no run id: MLflow is never touched
    sink.params({"global_batch": 64, "backend": "gloo"})
    sink.metrics({"perf/samples_per_s": 1234.5}, step=10)
    sink.epoch(EpochStats(1, 0.5, 0.4, 0.9, 1000.0, 2.0, 0.01), step=20)
    sink.finish()
    after = int(time.time() * 1000)

    recs = lines(tmp_path / METRICS_FILE)
    assert [set(r) - {"time_ms"} for r in recs] == [{"params"}, {"step", "metrics"}, {"step", "metrics"}]
    assert recs[0]["params"] == {"train.global_batch": "64", "train.backend": "gloo"}
    assert recs[1]["step"] == 10 and recs[1]["metrics"] == {"perf/samples_per_s": 1234.5}
    # An epoch's record is stepped by the epoch number, as the MLflow curves always were.
    assert recs[2]["step"] == 1
    assert recs[2]["metrics"] == {"train/train_loss": 0.5, "train/val_loss": 0.4, "train/val_accuracy": 0.9,
                                  "train/samples_per_s": 1000.0, "train/epoch_time_s": 2.0, "train/lr": 0.01}
    assert all(before <= r["time_ms"] <= after for r in recs)


def test_other_ranks_and_a_sink_without_folder_write_nothing(tmp_path, no_run):
    other = MetricsSink.for_rank(False, tmp_path)
    other.params({"a": 1})
    other.metrics({"m": 1.0}, step=1)
    other.finish()
    assert not (tmp_path / METRICS_FILE).exists()
    MetricsSink.for_rank(True).metrics({"m": 1.0}, step=1)  # no out dir: log lines only, no error
    assert list(tmp_path.iterdir()) == []


def test_a_restarted_writer_appends_and_a_torn_line_costs_only_itself(tmp_path, caplog):
    path = tmp_path / METRICS_FILE
    first = MetricsWriter(path)
    first.write(metrics_record({"m": 1.0}, 1, 1000))
    first.close()
    with open(path, "a") as f:  # a worker killed in the middle of a line
        f.write('{"time_ms":1001,"step":2,"metr')
    second = MetricsWriter(path)
    second.write(metrics_record({"m": 3.0}, 3, 1002))
    second.close()

    with caplog.at_level(logging.WARNING):
        recs, offset = read_records(path, 0)
    assert [(r["step"], r["metrics"]["m"]) for r in recs] == [(1, 1.0), (3, 3.0)]
    assert offset == file_size(path)
    assert "malformed" in caplog.text


def test_reader_leaves_a_partial_last_line_for_the_next_read(tmp_path):
    path = tmp_path / METRICS_FILE
    assert read_records(path, 0) == ([], 0)  # not written yet
    whole = json.dumps(metrics_record({"m": 1.0}, 1, 1000)) + "\n"
    second = json.dumps(metrics_record({"m": 2.0}, 2, 2000)) + "\n"
    path.write_text(whole + second[:10])

    recs, offset = read_records(path, 0)
    assert [r["step"] for r in recs] == [1] and offset == len(whole)
    assert read_records(path, offset) == ([], offset)  # still partial: nothing consumed

    with open(path, "a") as f:
        f.write(second[10:])
    recs, offset2 = read_records(path, offset)
    assert [r["step"] for r in recs] == [2] and offset2 == len(whole) + len(second)
    assert read_records(path, offset2) == ([], offset2)  # each record is read once


def test_reader_restarts_at_zero_when_the_file_was_replaced(tmp_path, caplog):
    path = tmp_path / METRICS_FILE
    path.write_text(json.dumps(metrics_record({"m": 1.0}, 1, 1000)) + "\n")
    with caplog.at_level(logging.WARNING):
        recs, offset = read_records(path, 10_000)
    assert [r["step"] for r in recs] == [1] and offset == file_size(path)
    assert "shrank" in caplog.text
