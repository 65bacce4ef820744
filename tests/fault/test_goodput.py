"""The goodput ledger across a real SIGKILL: torchrun restarts the group, and result.json says
what the death cost (restart time, repeated steps) and how the checkpoint interval changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_helpers import train
from training.goodput import LEDGER_FILE, read_events, young_daly_steps

pytestmark = pytest.mark.fault

EVERY = 10
# checkpoint_every: auto keeps the fixed interval until a failure has been seen.
JOB = ["training.epochs=3", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=5",
       "training.max_restarts=1", "training.checkpoint_every=auto"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, bundled_data):
    return train(tmp_path_factory.mktemp("clean") / "out", JOB)


@pytest.fixture(scope="module")
def killed(tmp_path_factory, bundled_data):
    return train(tmp_path_factory.mktemp("killed") / "out", JOB, env={"TRAINFLOW_FAULT": "kill@step=25,rank=1"})


def _parts_add_up(g: dict) -> None:
    parts = g["productive_s"] + g["startup_s"] + g["restart_s"] + g["lost_s"] + g["checkpoint_stall_s"]
    assert parts == pytest.approx(g["wall_s"], abs=0.01)


def test_a_run_without_failures_loses_only_start_up_and_checkpoint_stalls(clean):
    g = clean["goodput"]
    assert (g["attempts"], g["failures"], g["restart_s"], g["lost_steps"]) == (1, 0, 0, 0)
    assert 0 < g["goodput"] < 1 and g["startup_s"] > 0
    # every checkpoint of the run, mid-epoch (every 10 steps) and at each epoch's end
    assert g["checkpoints"] == len({*range(EVERY, clean["steps"] + 1, EVERY), 21, 42, 63})
    assert g["checkpoint_stall_s"] == pytest.approx(clean["checkpoint_stall_s"], abs=0.01)
    _parts_add_up(g)


def test_a_sigkilled_worker_costs_restart_time_and_lowers_goodput(clean, killed):
    g = killed["goodput"]
    assert killed["status"] == "completed" and killed["restarts"] == 1
    assert g["attempts"] == 2 and g["failures"] == 1 and g["jobs"] == 1
    assert g["restart_s"] > 0 and g["lost_steps"] >= 0
    (restart,) = g["restarts"]
    assert restart["resumed_from_step"] == killed["resumed_from_step"] == 21
    # torchrun's share (death -> new worker process) and the worker's (process -> first step)
    assert restart["agent_s"] >= 0 and restart["worker_s"] > 0
    assert restart["restart_s"] == pytest.approx(restart["agent_s"] + restart["worker_s"], abs=0.01)
    assert g["goodput"] < clean["goodput"]["goodput"]
    _parts_add_up(g)
    # The ledger survived the kill: the first attempt's events are there, with no finish.
    events = read_events(Path(killed["out_dir"]) / LEDGER_FILE)
    assert [e["attempt"] for e in events if e["ev"] == "start"] == [0, 1]
    assert [e["status"] for e in events if e["ev"] == "finish"] == ["completed"]


def test_checkpoint_every_auto_turns_to_young_daly_after_the_failure(clean, killed):
    fixed = clean["checkpoint_interval"]
    assert (fixed["mode"], fixed["rule"], fixed["steps"], fixed["failures"]) == ("auto", "fixed", EVERY, 0)
    choice = killed["checkpoint_interval"]
    assert choice["rule"] == "young_daly" and choice["failures"] == 1
    assert choice["steps"] == young_daly_steps(choice["checkpoint_cost_s"], choice["mtbf_s"], choice["step_time_s"])
    # A changed interval moves only when checkpoints are taken: the weights are those of the clean run.
    assert killed["weights_sha256"] == clean["weights_sha256"]
