"""Training progress followed from rank 0's metrics file (flows.progress): step/total from the
params, throughput and ETA from the perf windows, epoch ends as progress too, the first movement
and the end always shown (lines when not on a terminal)."""

from __future__ import annotations

import logging

from core.metrics_file import MetricsWriter, metrics_record, params_record
from flows.progress import Point, ProgressFollower, advance


def test_step_total_throughput_and_eta_from_the_records():
    p = Point()
    assert not advance(p, params_record({"train.steps_per_epoch": 10, "train.global_batch": 64}, 0), epochs=4)
    assert (p.total, p.global_batch) == (40, 64)
    assert advance(p, metrics_record({"perf/samples_per_s": 640.0, "perf/tokens_per_s": 9000.0}, 20, 0), 4)
    assert p.percent == 50.0 and p.eta_s == 2.0  # 20 steps x 64 samples at 640 samples/s
    assert p.text() == "step 20/40 (50%), 640 samples/s, 9,000 tokens/s, ETA 2s"
    assert advance(p, metrics_record({"train/train_loss": 0.3, "train/samples_per_s": 500.0}, 3, 0), 4)
    assert p.step == 30 and p.samples_per_s == 500.0  # the end of epoch 3 of 4
    assert not advance(p, metrics_record({"rank/0/mem": 1.0}, 31, 0), 4)
    resized = Point()
    advance(resized, params_record({"resized_at_step_7.train.steps_per_epoch": 5}, 0), 2)
    assert resized.total == 10 and resized.text() == "step 0/10 (0%)"


def test_follower_shows_the_first_movement_and_the_end_as_lines(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.write(params_record({"train.steps_per_epoch": 5, "train.global_batch": 8}, 0))
    w.write(metrics_record({"perf/samples_per_s": 80.0}, 2, 0))
    w.write(metrics_record({"perf/samples_per_s": 90.0}, 4, 0))
    follower = ProgressFollower(path, 2, 0, logging.getLogger("t"), artifact=False, bar=False, description="d")
    with caplog.at_level(logging.INFO, "t"):
        follower.poll()
        w.write(metrics_record({"train/train_loss": 0.5}, 1, 0))
        follower.poll()  # not due: nothing shown between the first movement and the end
        follower.finish(completed=True)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["training progress: step 4/10 (40%), 90 samples/s, ETA 1s",
                     "training progress: done: step 10/10 (100%), 90 samples/s, ETA 0s"]


def test_a_job_that_stopped_early_is_not_said_done(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write(params_record({"train.steps_per_epoch": 5}, 0))
    follower = ProgressFollower(path, 2, 0, logging.getLogger("t"), artifact=False, bar=False, description="d")
    with caplog.at_level(logging.INFO, "t"):
        follower.finish(completed=False)
    assert [r.getMessage() for r in caplog.records] == ["training progress: stopped: step 0/10 (0%)"]


def test_on_a_terminal_it_is_a_bar_that_ends_full(tmp_path, caplog):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.write(params_record({"train.steps_per_epoch": 4, "train.global_batch": 8}, 0))
    w.write(metrics_record({"perf/samples_per_s": 80.0}, 2, 0))
    follower = ProgressFollower(path, 1, 0, logging.getLogger("t"), artifact=False, bar=True, description="d")
    with caplog.at_level(logging.INFO, "t"):
        follower.start()
        follower.poll()
        assert follower._bar.tasks[0].completed == 50.0
        follower.finish(completed=True)
    task = follower._bar.tasks[0]
    assert task.completed == 100.0 and task.description.startswith("done: step 4/4 (100%)")
    assert caplog.records == []  # the bar, not log lines
