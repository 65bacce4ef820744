"""Model-parallel checkpoints (DCP): a preempted tp / pp run resumes on the same layout and ends
bitwise equal to an uninterrupted one; a checkpoint of another layout is refused."""

from __future__ import annotations

import shutil

import pytest

from tests.engine_helpers import LM_LAYOUTS, lm_ok, lm_runs, train_lm

pytestmark = pytest.mark.fault

# 2 epochs of 8 steps. SIGTERM at step 12, mid-epoch 2; ranks agree on it every 4 steps, so
# they checkpoint at step 12, and the resumed run trains the last 4.
PREEMPT = ["training.epochs=2", "training.preempt_check_steps=4"]


def _job(name: str) -> list[str]:
    return [*LM_LAYOUTS[name], *PREEMPT]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One uninterrupted run per layout, started on first use: {name: (result, out folder)}.
    The resume test compares with it; the refusal test resumes from a copy of the tp one's folder."""
    return lm_runs(tmp_path_factory, {name: (_job(name), 2) for name in ("tp", "pp")})


@pytest.mark.parametrize("name", ["tp", "pp"])
def test_preempted_model_parallel_run_resumes_bitwise_equal(uninterrupted, tmp_path, name):
    clean = uninterrupted(name)[0]
    out = tmp_path / "out"
    first = lm_ok(train_lm(out, _job(name), nproc=2, env={"TRAINFLOW_FAULT": "sigterm@step=12"}))
    assert first["status"] == "preempted" and first["steps"] == 12
    shards = sorted(p.name for p in (out / "checkpoints" / "step_00000012").iterdir())
    assert shards == [".metadata", "COMPLETE", "__0_0.distcp", "__1_0.distcp", "extra.pt"]  # DCP, one file per rank
    again = lm_ok(train_lm(out, _job(name), nproc=2))
    assert again["status"] == "completed" and again["resumed_from_step"] == 12
    assert again["weights_sha256"] == clean["weights_sha256"]
    assert [h["val_loss"] for h in again["history"]] == [h["val_loss"] for h in clean["history"]]


def test_checkpoint_of_another_layout_is_refused_even_when_forced(uninterrupted, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(uninterrupted("tp")[1], out)  # a finished tp run's folder: its DCP checkpoints
    rc, result, log = train_lm(out, _job("pp"), nproc=2, force_resume=True)
    assert rc != 0 and result is None
    assert "CheckpointMismatchError" in log
    assert "written with strategy 'tp', world size 2, dp 1 x tp 2 x pp 1" in log
    assert "this run has strategy 'pp', world size 2, dp 1 x tp 1 x pp 2" in log
