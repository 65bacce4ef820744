"""Model-parallel checkpoints (DCP): a preempted tp / pp run resumes on the same layout and ends
bitwise equal to an uninterrupted one; a checkpoint of another layout is refused."""

from __future__ import annotations

import pytest

from tests.engine_helpers import LM_LAYOUTS, lm_ok, train_lm

pytestmark = pytest.mark.fault

# SIGTERM at step 12 (of 24); ranks agree on it every 4 steps, so they checkpoint at step 12.
PREEMPT = ["training.preempt_check_steps=4"]


@pytest.mark.parametrize("name", ["tp", "pp"])
def test_preempted_model_parallel_run_resumes_bitwise_equal(tmp_path, name):
    job = [*LM_LAYOUTS[name], *PREEMPT]
    clean = lm_ok(train_lm(tmp_path / "clean", job, nproc=2))
    out = tmp_path / "out"
    first = lm_ok(train_lm(out, job, nproc=2, env={"TRAINFLOW_FAULT": "sigterm@step=12"}))
    assert first["status"] == "preempted" and first["steps"] == 12
    shards = sorted(p.name for p in (out / "checkpoints" / "step_00000012").iterdir())
    assert shards == [".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "extra.pt"]  # DCP, one file per rank
    again = lm_ok(train_lm(out, job, nproc=2))
    assert again["status"] == "completed" and again["resumed_from_step"] == 12
    assert again["weights_sha256"] == clean["weights_sha256"]
    assert [h["val_loss"] for h in again["history"]] == [h["val_loss"] for h in clean["history"]]


def test_checkpoint_of_another_layout_is_refused_even_when_forced(tmp_path):
    out = tmp_path / "out"
    lm_ok(train_lm(out, [*LM_LAYOUTS["tp"], "training.epochs=1"], nproc=2))
    rc, result, log = train_lm(out, [*LM_LAYOUTS["pp"], "training.epochs=1"], nproc=2, force_resume=True)
    assert rc != 0 and result is None
    assert "CheckpointMismatchError" in log
    assert "written with strategy 'tp', world size 2, dp 1 x tp 2 x pp 1" in log
    assert "this run has strategy 'pp', world size 2, dp 1 x tp 1 x pp 2" in log
