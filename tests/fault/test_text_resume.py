"""The text_classification task (a tiny BERT-like encoder made here) under the engine's faults, on 2
gloo ranks: a SIGKILLed DDP worker resumes bitwise equal with the best epoch kept; FSDP2 shards each
transformer block, and a run preempted at 2 FSDP workers resumes on 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from core.config import load_config
from core.errors import PreemptedError
from tests.hf_models import tiny_encoder
from tests.text_data import tickets
from training.launcher import launch
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.fault

EVERY = 5
KILL_STEP = 12
# Early stopping on and never stopping (patience 5 of 3 epochs), improving after epoch 1 only by more
# than min_delta 1 on val_loss (never): the run ends with epoch 1's weights, which a resume must carry.
CONFIG = {
    "name": "tickets", "task": "text_classification", "seed": 0,
    "dataset": {"path": "data/tickets", "dvc_file": "data/tickets.dvc", "file": "tickets.csv",
                "label": "category", "expectations_file": "tickets.expectations.yaml"},
    "pretrained": {"path": "models/enc", "text_column": "text", "max_length": 24},
    "training": {"epochs": 3, "batch_size": 8, "base_batch": 8, "lr": 0.005, "strategy": "ddp",
                 "checkpoint_every_steps": EVERY, "keep_checkpoints": 5, "timeout_s": 240,
                 "collective_timeout_s": 60, "early_stopping": {"patience": 5, "min_delta": 1.0}},
    "registry": {"model_name": "tickets", "experiment": "trainflow-tickets"},
}
EXPECTATIONS = """version: 1
format: table
columns: [text]
label: category
labels: [billing, bug, praise]
rows: {train: [50, 400], test: [10, 100]}
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A project folder: 160 tickets, an encoder folder, its expectations and config."""
    root = tmp_path_factory.mktemp("text-root")
    (root / ".dvc").mkdir()
    (root / "data" / "tickets").mkdir(parents=True)
    df = tickets(160)
    df.to_csv(root / "data" / "tickets" / "tickets.csv", index=False)
    tiny_encoder(root / "models" / "enc", df["text"])
    (root / "tickets.expectations.yaml").write_text(EXPECTATIONS)
    (root / "tickets.yaml").write_text(yaml.safe_dump(CONFIG))
    return root


def _train(root: Path, out: Path, overrides=(), env=None, nproc: int = 2) -> dict:
    cfg = load_config(root / "tickets.yaml", list(overrides))
    return launch(plan_launch(cfg, HostFacts(), nproc), out, root, "test-data-md5", env).finish()


@pytest.fixture(scope="module")
def uninterrupted(root, tmp_path_factory):
    return _train(root, tmp_path_factory.mktemp("clean") / "out")


def test_killed_text_worker_restarts_and_resumes_bitwise_equal_keeping_the_best_epoch(root, uninterrupted, tmp_path):
    r = _train(root, tmp_path / "out", env={"TRAINFLOW_FAULT": f"kill@step={KILL_STEP},rank=1"})
    assert r["status"] == "completed" and r["restarts"] == 1
    assert r["resumed_from_step"] is not None and KILL_STEP - r["resumed_from_step"] <= EVERY
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]
    assert r["steps"] == uninterrupted["steps"]
    assert r["kept_epoch"] == uninterrupted["kept_epoch"]
    assert (r["kept_epoch"]["epoch"], r["kept_epoch"]["of"], r["kept_epoch"]["restored"]) == (1, 3, True)


def test_fsdp_shards_blocks_on_two_ranks_and_a_preempted_run_resumes_on_one(root, uninterrupted, tmp_path):
    out = tmp_path / "out"
    job = ["training.strategy=fsdp", "training.preempt_check_steps=1"]
    with pytest.raises(PreemptedError):
        _train(root, out, job, env={"TRAINFLOW_FAULT": "sigterm@step=8"})
    mid = json.loads((out / "result.json").read_text())
    assert mid["world_size"] == 2 and mid["layout"]["strategy"] == "fsdp"
    # Each rank holds about half the parameters: the blocks and the root are sharded.
    full = uninterrupted["ranks"][0]["param_bytes"]
    assert all(rank["param_bytes"] < 0.6 * full for rank in mid["ranks"])
    r = _train(root, out, job, nproc=1)
    assert r["status"] == "completed" and r["resumed_from_step"] == 8 and r["world_size"] == 1
    assert r["resized_from"]["world_size"] == 2 and r["steps"] == uninterrupted["steps"]
    assert r["global_batch"] == uninterrupted["global_batch"]
    # Not bitwise (another world size sums in another order), but the same training.
    assert abs(r["final"]["val_accuracy"] - uninterrupted["final"]["val_accuracy"]) <= 0.1
