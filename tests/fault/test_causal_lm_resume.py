"""The causal_lm task under the engine's promises, on 2 CPU/gloo ranks with FSDP2 sharded per
transformer block and LoRA adapters: a SIGKILLed worker resumes from its DCP checkpoint and ends
bitwise equal to an uninterrupted run; a run preempted at 2 workers resumes on 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from core.config import load_config
from core.errors import PreemptedError
from tests.causal_data import write_project
from training.launcher import launch
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.fault

EVERY = 4
JOB = ["training.strategy=fsdp", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=3",
       "training.max_restarts=1", "training.timeout_s=240", "training.collective_timeout_s=60"]
KILL_STEP = 10


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("causal-fault")
    raw = write_project(root, "pairs", n_train=160, n_eval=10)
    raw["pretrained"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.1}
    (root / "chat.yaml").write_text(yaml.safe_dump(raw))
    return root


def train(project: Path, out: Path, sets=(), env=None, nproc: int = 2) -> dict:
    cfg = load_config(project / "chat.yaml", [*JOB, *sets])
    return launch(plan_launch(cfg, HostFacts(), nproc), out, project, "test-data-md5",
                  {"TRAINFLOW_HOME": str(project / ".trainflow"), **(env or {})}).finish()


@pytest.fixture(scope="module")
def uninterrupted(project) -> dict:
    return train(project, project / "clean")


def test_fsdp_per_block_trains_only_the_adapters_and_exports_a_merged_folder(uninterrupted):
    r = uninterrupted
    assert r["status"] == "completed" and r["world_size"] == 2 and r["strategy"] == "fsdp"
    assert r["history"][-1]["train_loss"] < r["history"][0]["train_loss"]
    # Each rank holds its shard of the weights, and optimizer state for the adapters alone (AdamW's
    # two moments of a few percent of the parameters).
    for rank in r["ranks"]:
        assert 0 < rank["optim_bytes"] < 0.2 * rank["param_bytes"], rank
    exported = Path(r["out_dir"]) / r["model_pt2"]
    assert (exported / "model.safetensors").is_file() and (exported / "tokenizer.json").is_file()
    assert "lora" not in (exported / "config.json").read_text()


def test_a_sigkilled_worker_resumes_from_dcp_bitwise_equal(project, uninterrupted):
    r = train(project, project / "killed", env={"TRAINFLOW_FAULT": f"kill@step={KILL_STEP},rank=1"})
    assert r["status"] == "completed" and r["restarts"] == 1
    assert KILL_STEP - EVERY <= r["resumed_from_step"] < KILL_STEP
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]


def test_preempted_at_two_workers_resumes_on_one(project, uninterrupted):
    out = project / "resized"
    with pytest.raises(PreemptedError):
        train(project, out, ["training.preempt_check_steps=1"], env={"TRAINFLOW_FAULT": "sigterm@step=6"})
    r = train(project, out, ["training.preempt_check_steps=1"], nproc=1)
    assert r["status"] == "completed" and r["world_size"] == 1 and r["resumed_from_step"] == 6
    assert r["resized_from"]["world_size"] == 2 and r["steps"] == uninterrupted["steps"]
    # Not bitwise (the reduction order changes), but the same training.
    assert abs(r["final"]["val_loss"] - uninterrupted["final"]["val_loss"]) < 0.05
