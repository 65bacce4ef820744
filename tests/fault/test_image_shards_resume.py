"""A sharded image set under faults, its DataLoader workers on (one per rank) and augmentation on
(random resized crop, flip, jitter): a SIGKILLed worker resumes bitwise equal, and a run preempted at
2 workers and resumed on 1 sees each image exactly once per epoch. The bundled digits as tar shards."""

from __future__ import annotations

from collections import Counter

import pytest

from core.config import load_config
from core.errors import PreemptedError
from tests.engine_helpers import IMAGE_ENGINE_CONFIG, ROOT
from training.faults import IDS_ENV, read_recorded_ids

pytestmark = pytest.mark.fault

EVERY = 10
JOB = ["training.epochs=2", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=5",
       "dataset.path=data/digit-shards", "dataset.dvc_file=data/digit-shards.dvc", "dataset.images.shards=.",
       "dataset.images.workers=1", "dataset.images.augment.crop_scale=[0.6, 1.0]",
       "dataset.images.augment.jitter=0.2", "training.loader.shuffle_row_groups=3"]
KILL_STEP = 25


@pytest.fixture(scope="module")
def shard_root(tmp_path_factory, bundled_data):
    """A folder holding the bundled digit images as tar shards of 200 samples."""
    from core.config import DatasetConfig
    from tasks.image_options import ImagesConfig
    from tasks.image_data import list_images
    from tasks.image_shards import write_shards

    root = tmp_path_factory.mktemp("shards")
    entries = list_images(DatasetConfig(path="data/digit-images", images=ImagesConfig()), ROOT, 0)
    for split in ("train", "test"):
        write_shards(ROOT / "data" / "digit-images", entries[split], root / "data" / "digit-shards" / split, 200)
    return root


def _train(root, out, overrides=JOB, env=None, nproc: int = 2) -> dict:
    from training.launcher import launch
    from training.plan import HostFacts, plan_launch

    cfg = load_config(IMAGE_ENGINE_CONFIG, list(overrides))
    return launch(plan_launch(cfg, HostFacts(), nproc), out, root, "test-data-md5", env, False).finish()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, shard_root):
    return _train(shard_root, tmp_path_factory.mktemp("clean") / "out")


def test_killed_sharded_image_worker_resumes_bitwise_equal_with_dataloader_workers(uninterrupted, shard_root,
                                                                                  tmp_path):
    r = _train(shard_root, tmp_path / "out", env={"TRAINFLOW_FAULT": f"kill@step={KILL_STEP},rank=1"})
    assert r["status"] == "completed" and r["restarts"] == 1
    assert r["resumed_from_step"] is not None and KILL_STEP - r["resumed_from_step"] <= EVERY
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]
    assert r["steps"] == uninterrupted["steps"]


def test_sharded_run_preempted_at_2_and_resumed_on_1_sees_each_image_once_per_epoch(uninterrupted, shard_root,
                                                                                  tmp_path):
    from training.data import load_splits

    out, ids = tmp_path / "out", tmp_path / "ids"
    job = [*JOB, "training.preempt_check_steps=1"]
    with pytest.raises(PreemptedError):
        _train(shard_root, out, job, env={IDS_ENV: str(ids), "TRAINFLOW_FAULT": "sigterm@step=10"})
    r = _train(shard_root, out, job, nproc=1, env={IDS_ENV: str(ids)})
    assert r["status"] == "completed" and r["resumed_from_step"] == 10 and r["world_size"] == 1
    assert r["resized_from"]["world_size"] == 2 and r["steps"] == uninterrupted["steps"]

    source = load_splits(load_config(IMAGE_ENGINE_CONFIG, JOB), shard_root, 0).train
    train_ids = {int(i) for u in range(len(source.groups)) for i in source.train_ids(u)}
    records = read_recorded_ids(ids)
    for epoch in range(2):
        seen = Counter(i for rec in records if rec["epoch"] == epoch for i in rec["ids"])
        assert set(seen) == train_ids and set(seen.values()) == {1}, f"epoch {epoch}"
