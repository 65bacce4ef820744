"""The image task under the same faults as tables: a SIGKILLed worker resumes bitwise equal (the
train-time augmentation included), and a run resized 2 -> 1 workers sees each image once per epoch."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from core.errors import PreemptedError
from tests.engine_helpers import IMAGE_ENGINE_CONFIG, ROOT, train
from training.faults import IDS_ENV, read_recorded_ids

pytestmark = pytest.mark.fault

EVERY = 10
JOB = ["training.epochs=3", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=5"]
KILL_STEP = 25


def _train(out, overrides=JOB, **kw):
    return train(out, overrides, config=IMAGE_ENGINE_CONFIG, **kw)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bundled_data):
    return _train(tmp_path_factory.mktemp("clean") / "out")


def test_killed_image_worker_restarts_and_resumes_bitwise_equal(uninterrupted, tmp_path):
    r = _train(tmp_path / "out", env={"TRAINFLOW_FAULT": f"kill@step={KILL_STEP},rank=1"})
    assert r["status"] == "completed" and r["restarts"] == 1
    assert r["resumed_from_step"] is not None and KILL_STEP - r["resumed_from_step"] <= EVERY
    # The shifts are drawn from torch's CPU generator, whose state the checkpoint holds.
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]
    assert r["steps"] == uninterrupted["steps"]


def test_image_run_resized_2_to_1_sees_each_image_once_per_epoch(uninterrupted, tmp_path):
    from core.config import load_config
    from training.data import load_splits

    out, ids = tmp_path / "out", tmp_path / "ids"
    job = [*JOB, "training.preempt_check_steps=1"]
    with pytest.raises(PreemptedError):
        _train(out, job, env={IDS_ENV: str(ids), "TRAINFLOW_FAULT": "sigterm@step=10"})
    r = _train(out, job, nproc=1, env={IDS_ENV: str(ids)})
    assert r["status"] == "completed" and r["resumed_from_step"] == 10 and r["world_size"] == 1
    assert r["resized_from"]["world_size"] == 2 and r["steps"] == uninterrupted["steps"]
    assert r["global_batch"] == uninterrupted["global_batch"]

    n_train = len(load_splits(load_config(IMAGE_ENGINE_CONFIG), ROOT, 0).train)
    records = read_recorded_ids(ids)
    for epoch in range(3):
        seen = Counter(i for rec in records if rec["epoch"] == epoch for i in rec["ids"])
        assert set(seen) == set(range(n_train)) and set(seen.values()) == {1}, f"epoch {epoch}"
    # Not bitwise (another world size sums in another order), but the same training: within 6 of 149 images.
    assert abs(r["final"]["val_accuracy"] - uninterrupted["final"]["val_accuracy"]) <= 0.04
    assert json.loads((out / "result.json").read_text())["steps"] == r["steps"]
