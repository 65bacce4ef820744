"""What ties a training job's processes to the run that started them, in this process: a
parent-death request, SIGHUP taken as a preemption, folders no process holds, a worker that finds
no launcher to wait for. (With real child processes: tests/integration/test_process_lifetime.py.)"""

from __future__ import annotations

import os
import signal

from core.locks import release
from core.procs import die_with_parent
from training import preemption
from training.slots import claim_train_dir


def test_binding_to_a_parent_that_is_gone_already_says_so():
    # Signal 0 clears the request again: this test process stays unbound.
    assert die_with_parent(0, os.getppid())
    assert not die_with_parent(0, os.getpid())  # not our parent: it "exited" before the request


def test_sighup_asks_the_launcher_to_preempt_as_sigterm_does():
    previous = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    try:
        assert preemption.install_handler()
        os.kill(os.getpid(), signal.SIGHUP)
        assert preemption.REQUESTED.wait(5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        preemption.REQUESTED.clear()


def test_unclaimed_resumable_lists_interrupted_folders_no_process_holds(tmp_path):
    from training.slots import slot_base, unclaimed_resumable

    inputs = (tmp_path, "digits", "config-id", "data-md5", 2)
    base = slot_base(*inputs)
    assert unclaimed_resumable(*inputs) == []
    folders = [base, base.with_name(base.name + ".1"), base.with_name(base.name + ".2")]
    for folder in folders:
        (folder / "checkpoints" / "step_00000010").mkdir(parents=True)
    (folders[2] / "result.json").write_text('{"status": "completed"}')  # done: nothing to resume
    held, fd = claim_train_dir(*inputs)  # a live run holds the first
    try:
        assert held == base and unclaimed_resumable(*inputs) == [folders[1]]
    finally:
        release(fd)
    assert unclaimed_resumable(*inputs) == folders[:2]  # looking claims nothing


def test_a_worker_with_an_input_error_does_not_wait_without_a_launcher_or_once_it_is_gone(monkeypatch):
    """After writing fatal.json a worker waits for its launcher's SIGTERM; with no launcher named,
    or a launcher that no longer runs, it returns without a single wait."""
    from training import launcher
    from training.agent import LAUNCHER_PID_ENV

    waits = []
    monkeypatch.setattr(launcher.time, "sleep", waits.append)
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    launcher.await_stop_after_fatal(limit_s=600)
    never_a_pid = int(open("/proc/sys/kernel/pid_max").read()) + 1
    monkeypatch.setenv(LAUNCHER_PID_ENV, str(never_a_pid))
    launcher.await_stop_after_fatal(limit_s=600)
    assert waits == []
