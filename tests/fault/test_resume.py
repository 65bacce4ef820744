"""Kill, preempt and corrupt: training resumes and ends where an uninterrupted run ends."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from core.errors import ConfigError, PreemptedError
from tests.conftest import VENV_BIN
from tests.engine_helpers import train

pytestmark = pytest.mark.fault

EVERY = 10
JOB = ["training.epochs=3", f"training.checkpoint_every_steps={EVERY}", "training.keep_checkpoints=5"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bundled_data):
    return train(tmp_path_factory.mktemp("clean") / "out", JOB)


def test_killed_worker_restarts_and_resumes_bitwise_equal(uninterrupted, tmp_path):
    kill_step = 25
    r = train(tmp_path / "out", JOB, env={"TRAINFLOW_FAULT": f"kill@step={kill_step},rank=1"})
    assert r["status"] == "completed" and r["restarts"] == 1
    assert r["resumed_from_step"] == 21  # the end of epoch 1, the last checkpoint before step 25
    # At most one checkpoint interval of work is repeated.
    assert kill_step - r["resumed_from_step"] <= EVERY
    assert r["weights_sha256"] == uninterrupted["weights_sha256"]
    assert r["steps"] == uninterrupted["steps"]


def test_two_fresh_runs_with_one_seed_are_bitwise_equal(uninterrupted, tmp_path):
    assert train(tmp_path / "out", JOB)["weights_sha256"] == uninterrupted["weights_sha256"]


def test_corrupt_latest_checkpoint_is_skipped_and_resume_still_matches(uninterrupted, tmp_path, caplog):
    out = tmp_path / "out"
    first = train(out, JOB)
    steps = sorted((out / "checkpoints").glob("step_*"))
    # Truncate the newest two checkpoints (the final one and the one before it).
    for folder in steps[-2:]:
        (folder / "state.pt").write_bytes(b"truncated")
    again = train(out, JOB)
    assert again["resumed_from_step"] == int(steps[-3].name.split("_")[1])
    assert again["weights_sha256"] == first["weights_sha256"] == uninterrupted["weights_sha256"]


def test_checkpoint_of_another_config_is_refused_unless_forced(tmp_path):
    out = tmp_path / "out"
    train(out, ["training.epochs=1"])
    with pytest.raises(ConfigError, match="--force-resume"):  # refused before anything starts
        train(out, ["training.epochs=2", "training.lr=0.001"])
    forced = train(out, ["training.epochs=2", "training.lr=0.001"], force_resume=True)
    assert forced["status"] == "completed" and forced["resumed_from_step"] is not None


def test_sigterm_checkpoints_exits_4_and_the_next_run_resumes(repo_root, bundled_data, tmp_path):
    out = tmp_path / "out"
    cmd = [str(VENV_BIN / "trainflow"), "train", "--config", "tests/configs/digits-engine.yaml", "--out", str(out),
           "--set", "training.epochs=40", "--set", "training.timeout_s=240"]
    proc = subprocess.Popen(cmd, cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((out / "checkpoints").glob("step_*/COMPLETE")):  # training is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 4, err
    assert "preempted at step" in err
    import json

    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "preempted"
    stopped = result["steps"]
    assert (out / "checkpoints" / f"step_{stopped:08d}" / "COMPLETE").is_file()
    assert stopped < 40 * 21  # it stopped early, at a step boundary
    done = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    final = json.loads((out / "result.json").read_text())
    assert final["status"] == "completed" and final["resumed_from_step"] == stopped
    assert final["epochs_run"] == 40


def test_preempted_error_is_exit_code_4():
    assert PreemptedError("x").exit_code == 4
