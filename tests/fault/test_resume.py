"""Kill, preempt and corrupt: training resumes and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from core.errors import ConfigError, PreemptedError
from tests.conftest import VENV_BIN
from tests.engine_helpers import ENGINE_CONFIG, ROOT, train
from tests.waiting import wait_for
from training.faults import IDS_ENV, read_recorded_ids
from training.goodput import LEDGER_FILE, read_events, young_daly_steps

pytestmark = pytest.mark.fault

EVERY = 10
# checkpoint_every: auto keeps the fixed interval until a failure has been seen (the goodput tests).
# Early stopping on, never stopping (patience 5 of 3 epochs) and never improving after epoch 1
# (min_delta 1 on a macro-F1): the run ends with epoch 1's weights, which a resume must carry.
# Every due checkpoint is written (no checkpoint_budget): the goodput test counts them.
JOB = ["training.epochs=3", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=5",
       "training.checkpoint_every=auto", "training.checkpoint_budget=null", "training.early_stopping.patience=5",
       "training.early_stopping.metric=val_macro_f1", "training.early_stopping.min_delta=1"]
KILL_STEP = 25


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bundled_data):
    return train(tmp_path_factory.mktemp("clean") / "out", JOB)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, bundled_data):
    """The same job with rank 1 SIGKILLed at step 25: torchrun restarts the group once."""
    return train(tmp_path_factory.mktemp("killed") / "out", JOB,
                 env={"TRAINFLOW_FAULT": f"kill@step={KILL_STEP},rank=1"})


def test_killed_worker_restarts_and_resumes_bitwise_equal(uninterrupted, killed):
    kill_step, r = KILL_STEP, killed
    assert r["status"] == "completed" and r["restarts"] == 1
    assert r["resumed_from_step"] == 21  # the end of epoch 1, the last checkpoint before step 25
    # At most one checkpoint interval of work is repeated.
    assert kill_step - r["resumed_from_step"] <= EVERY
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]
    assert r["steps"] == uninterrupted["steps"]
    # The best epoch's weights came back from the checkpoint the restart resumed from.
    assert r["kept_epoch"] == uninterrupted["kept_epoch"]
    assert (r["kept_epoch"]["epoch"], r["kept_epoch"]["of"], r["kept_epoch"]["restored"]) == (1, 3, True)


def test_corrupt_latest_checkpoint_is_skipped_and_resume_still_matches(uninterrupted, tmp_path, caplog):
    # A copy of the uninterrupted run's folder. (That two fresh runs with one seed are bitwise
    # equal is test_reproduce's, end to end: it trains the champion's config again in a new folder.)
    out = tmp_path / "out"
    shutil.copytree(uninterrupted["out_dir"], out)
    steps = sorted((out / "checkpoints").glob("step_*"))
    # Truncate the newest two checkpoints (the final one and the one before it).
    for folder in steps[-2:]:
        (folder / "__0_0.distcp").write_bytes(b"truncated")
    again = train(out, JOB)
    assert again["resumed_from_step"] == int(steps[-3].name.split("_")[1])
    assert again["weights_sha256"] == uninterrupted["weights_sha256"]


def test_checkpoint_of_another_config_is_refused_unless_forced(uninterrupted, tmp_path):
    # A copy of the uninterrupted run's folder: its checkpoints are those of JOB's config.
    out = tmp_path / "out"
    shutil.copytree(uninterrupted["out_dir"], out)
    other = ["training.epochs=4", "training.lr=0.001"]
    with pytest.raises(ConfigError, match="--force-resume"):  # refused before anything starts
        train(out, other)
    forced = train(out, other, force_resume=True)
    assert forced["status"] == "completed" and forced["resumed_from_step"] is not None


def test_sigterm_checkpoints_exits_4_and_the_next_run_resumes(repo_root, bundled_data, tmp_path):
    out = tmp_path / "out"
    epochs = 6
    cmd = [str(VENV_BIN / "trainflow"), "train", "--config", "tests/configs/digits-engine.yaml", "--out", str(out),
           "--set", f"training.epochs={epochs}", "--set", "training.timeout_s=240"]
    # The first attempt's ranks sleep 250 ms a step (the slow fault is not part of the config), so
    # it is still training, 25 s from its end, when the SIGTERM comes after its first checkpoint;
    # the resumed attempt runs at full speed.
    slowed = {**os.environ, "TRAINFLOW_FAULT": "slow@step=1,ms=250"}
    proc = subprocess.Popen(cmd, cwd=repo_root, env=slowed, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def checkpointed() -> bool:  # training is under way
        assert proc.poll() is None, proc.communicate()
        return bool(list((out / "checkpoints").glob("step_*/COMPLETE")))

    wait_for(checkpointed, 120, "the first checkpoint", poll_s=0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 4, err
    assert "preempted at step" in err
    import json

    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "preempted"
    stopped = result["steps"]
    assert (out / "checkpoints" / f"step_{stopped:08d}" / "COMPLETE").is_file()
    assert stopped < epochs * 21  # it stopped early, at a step boundary
    done = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    final = json.loads((out / "result.json").read_text())
    assert final["status"] == "completed" and final["resumed_from_step"] == stopped
    assert final["epochs_run"] == epochs


def test_resize_2_1_2_with_a_strategy_switch_sees_each_sample_once_per_epoch(uninterrupted, tmp_path):
    # 2 ddp workers -> 1 fsdp worker (a replicated checkpoint into shards) -> 2 ddp workers (shards
    # into replicas), each leg stopped by a preemption; every rank records the sample ids it trained on.
    from core.config import load_config
    from training.data import load_splits

    out, ids = tmp_path / "out", tmp_path / "ids"
    job = [*JOB, "training.preempt_check_steps=1"]
    with pytest.raises(PreemptedError):
        train(out, job, env={IDS_ENV: str(ids), "TRAINFLOW_FAULT": "sigterm@step=10"})
    with pytest.raises(PreemptedError):
        train(out, [*job, "training.strategy=fsdp"], nproc=1, env={IDS_ENV: str(ids), "TRAINFLOW_FAULT": "sigterm@step=35"})
    mid = json.loads((out / "result.json").read_text())
    assert mid["steps"] == 35 and mid["world_size"] == 1 and mid["strategy"] == "fsdp"
    assert mid["resized_from"] == {"world_size": 2, "strategy": "ddp", "dp_size": 2, "micro_batch": 32,
                                   "grad_accum": 1, "global_batch": 64}
    assert mid["batch_policy"]["decision"] == "kept_global_batch" and mid["batch_policy"]["grad_accum"] == 2
    r = train(out, job, env={IDS_ENV: str(ids)})
    assert r["status"] == "completed" and r["resumed_from_step"] == 35 and r["steps"] == uninterrupted["steps"]
    assert r["resized_from"] == {"world_size": 1, "strategy": "fsdp", "dp_size": 1, "micro_batch": 32,
                                 "grad_accum": 2, "global_batch": 64}
    assert r["global_batch"] == 64 and r["effective_lr"] == uninterrupted["effective_lr"]

    n_train = len(load_splits(load_config(ENGINE_CONFIG), ROOT, 0).train)
    records = read_recorded_ids(ids)
    assert sorted(rec["step"] for rec in records if rec["rank"] == 0) == list(range(1, r["steps"] + 1))
    for epoch in range(3):
        seen = Counter(i for rec in records if rec["epoch"] == epoch for i in rec["ids"])
        assert set(seen) == set(range(n_train)) and set(seen.values()) == {1}, f"epoch {epoch}"
    # Not bitwise (reduction order and dropout streams change), but the same training.
    for mine, clean in zip(r["history"], uninterrupted["history"]):
        assert abs(mine["train_loss"] - clean["train_loss"]) < 0.02
    assert abs(r["final"]["val_accuracy"] - uninterrupted["final"]["val_accuracy"]) <= 0.02


# -- the goodput ledger across the SIGKILL: what the death cost, and how the interval changed --
def _parts_add_up(g: dict) -> None:
    parts = g["productive_s"] + g["startup_s"] + g["restart_s"] + g["lost_s"] + g["checkpoint_stall_s"]
    assert parts == pytest.approx(g["wall_s"], abs=0.01)


def test_a_run_without_failures_loses_only_start_up_and_checkpoint_stalls(uninterrupted):
    g = uninterrupted["goodput"]
    assert (g["attempts"], g["failures"], g["restart_s"], g["lost_steps"]) == (1, 0, 0, 0)
    assert 0 < g["goodput"] < 1 and g["startup_s"] > 0
    # every checkpoint of the run, mid-epoch (every 10 steps) and at each epoch's end
    assert g["checkpoints"] == len({*range(EVERY, uninterrupted["steps"] + 1, EVERY), 21, 42, 63})
    assert g["checkpoint_stall_s"] == pytest.approx(uninterrupted["checkpoint_stall_s"], abs=0.01)
    _parts_add_up(g)


def test_a_sigkilled_worker_costs_restart_time_and_lowers_goodput(killed):
    g = killed["goodput"]
    assert killed["status"] == "completed" and killed["restarts"] == 1
    assert g["attempts"] == 2 and g["failures"] == 1 and g["jobs"] == 1
    assert g["restart_s"] > 0 and g["lost_steps"] >= 0
    (restart,) = g["restarts"]
    assert restart["resumed_from_step"] == killed["resumed_from_step"] == 21
    # torchrun's share (death -> new worker process) and the worker's (process -> first step)
    assert restart["agent_s"] >= 0 and restart["worker_s"] > 0
    assert restart["restart_s"] == pytest.approx(restart["agent_s"] + restart["worker_s"], abs=0.01)
    # The restart is counted against goodput. (Comparing with the clean run's goodput would compare
    # two runs' timings, which a loaded machine can invert.)
    assert g["goodput"] == pytest.approx(g["productive_s"] / g["wall_s"], abs=0.01)
    assert g["goodput"] <= 1 - g["restart_s"] / g["wall_s"] + 0.01
    _parts_add_up(g)
    # The ledger survived the kill: the first attempt's events are there, with no finish.
    events = read_events(Path(killed["out_dir"]) / LEDGER_FILE)
    assert [e["attempt"] for e in events if e["ev"] == "start"] == [0, 1]
    assert [e["status"] for e in events if e["ev"] == "finish"] == ["completed"]


def test_checkpoint_every_auto_turns_to_young_daly_after_the_failure(uninterrupted, killed):
    fixed = uninterrupted["checkpoint_interval"]
    assert (fixed["mode"], fixed["rule"], fixed["steps"], fixed["failures"]) == ("auto", "fixed", EVERY, 0)
    choice = killed["checkpoint_interval"]
    assert choice["rule"] == "young_daly" and choice["failures"] == 1
    assert choice["steps"] == young_daly_steps(choice["checkpoint_cost_s"], choice["mtbf_s"], choice["step_time_s"])
    # A changed interval moves only when checkpoints are taken: the weights are those of the clean run.
    assert killed["weights_sha256"] == uninterrupted["weights_sha256"]


def test_preempted_error_is_exit_code_4():
    assert PreemptedError("x").exit_code == 4
