"""The held-job protocol without processes: what a worker waits on, what ``go``/``abort`` write,
and how the flow's ``Prelaunch`` hands its job over (once) through the CLI's trusted channel."""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from core.errors import PreemptedError
from training import preemption
from training.agent import LAUNCHER_PID_ENV
from training.held import GO_FILE, HELD_ENV, HeldJob, wait_for_go

NO_SUCH_PID = 4_194_305  # above Linux's largest pid_max


class _Proc:
    """Stands for torchrun's Popen: it "exits" when asked to wait, unless told to hang."""

    def __init__(self, hangs: bool = False):
        self.hangs, self.waited = hangs, False

    def wait(self, timeout=None):
        self.waited = True
        if self.hangs:
            raise subprocess.TimeoutExpired("torchrun", timeout)
        return 0

    def poll(self):
        return None


def _held(tmp_path, hangs: bool = False) -> tuple[HeldJob, list]:
    killed: list = []
    job = SimpleNamespace(spec=SimpleNamespace(out_dir=str(tmp_path)), proc=_Proc(hangs), started_at=0.0,
                          kill=lambda now=False: killed.append(True))
    return HeldJob(job), killed


def _word(tmp_path) -> dict:
    return json.loads((tmp_path / GO_FILE).read_text())


def test_a_worker_waits_only_when_its_own_launcher_held_it(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_PID_ENV, str(os.getpid()))
    monkeypatch.delenv(HELD_ENV, raising=False)
    assert wait_for_go(tmp_path) == (True, "")  # a plain launch: no file, no wait
    monkeypatch.setenv(HELD_ENV, "1")  # inherited from another launcher's job: not this job's hold
    assert wait_for_go(tmp_path) == (True, "")
    monkeypatch.setenv(HELD_ENV, str(os.getpid()))
    (tmp_path / GO_FILE).write_text(json.dumps({"go": False, "reason": "validation failed"}))
    assert wait_for_go(tmp_path) == (False, "validation failed")
    (tmp_path / GO_FILE).write_text(json.dumps({"go": True}))
    assert wait_for_go(tmp_path) == (True, "")


def test_a_held_worker_gives_up_when_its_launcher_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv(LAUNCHER_PID_ENV, str(NO_SUCH_PID))
    monkeypatch.setenv(HELD_ENV, str(NO_SUCH_PID))
    go, why = wait_for_go(tmp_path)
    assert not go and why == f"the launching process {NO_SUCH_PID} exited before training started"


def test_go_lets_it_train_and_abort_stops_a_waiting_job_without_a_kill(tmp_path):
    held, killed = _held(tmp_path)
    assert held.waiting
    job = held.go()
    assert job is held.job and job.started_at > 0 and _word(tmp_path) == {"go": True} and not held.waiting
    other, killed = _held(tmp_path / "b")
    (tmp_path / "b").mkdir()
    other.abort("the flow ended before training")
    assert _word(tmp_path / "b") == {"go": False, "reason": "the flow ended before training"}
    assert other.job.proc.waited and not killed  # the workers left on their own


def test_a_job_that_ignores_abort_or_already_went_is_killed(tmp_path):
    held, killed = _held(tmp_path, hangs=True)
    held.abort("x", grace_s=0.01)
    assert killed == [True]
    gone, killed = _held(tmp_path / "b")
    (tmp_path / "b").mkdir()
    gone.go()
    gone.abort("x")
    assert killed == [True] and _word(tmp_path / "b") == {"go": True}  # the word is not taken back


def test_a_sigterm_while_held_aborts_instead_of_going(tmp_path):
    held, _ = _held(tmp_path)
    preemption.REQUESTED.set()
    try:
        with pytest.raises(PreemptedError, match="preempted before training started"):
            held.go()
        assert not preemption.REQUESTED.is_set()  # handled here: the run exits as preempted
    finally:
        preemption.REQUESTED.clear()
    assert _word(tmp_path) == {"go": False, "reason": "preempted before training started"}


def test_the_flow_takes_the_early_job_once_and_only_through_the_shell_channel(tmp_path):
    from flows.params import ShellInputs, early_job, from_shell
    from flows.prelaunch import Prelaunch, TrainFolder

    def prelaunch(folder):
        folder.mkdir()
        held, _ = _held(folder)
        return Prelaunch(("key",), TrainFolder(folder, None, held))

    early = prelaunch(tmp_path / "a")
    assert early_job() is None
    with from_shell(ShellInputs(tmp_path / "c.yaml", early=early)):
        assert early_job() is early
    assert early_job() is None
    slot = early.slot
    assert early.take(("key",)) is slot and early.take(("key",)) is None and early.slot is None
    early.abort("the flow ended before training")  # taken: the flow owns it, this is a no-op
    assert slot.held.waiting
    mismatch = prelaunch(tmp_path / "b")
    assert mismatch.take(("other",)) is None
    assert _word(tmp_path / "b")["go"] is False
