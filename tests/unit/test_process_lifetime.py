"""What ties a training job's processes to the run that started them: a parent-death signal,
SIGHUP taken as a preemption, and a folder lock shared with the job (fork only, no exec)."""

from __future__ import annotations

import os
import signal
import time

from core.locks import release
from core.procs import die_with_parent, pid_alive
from training import preemption
from training.slots import claim_train_dir


def _wait_gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not pid_alive(pid)


def test_a_process_bound_to_its_parent_dies_when_the_parent_is_killed():
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:  # stands for the launcher: starts a bound child, then waits to be killed
        try:
            if os.fork() == 0:
                bound = die_with_parent(signal.SIGKILL, os.getppid())
                os.write(w, f"{os.getpid()} {int(bound)}\n".encode())
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        child, bound = map(int, fh.readline().split())
    try:
        assert bound == 1
        os.kill(parent, signal.SIGKILL)
        os.waitpid(parent, 0)
        assert _wait_gone(child), "the bound child outlived its killed parent"
    finally:
        for pid in (parent, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


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


def test_a_folder_stays_claimed_while_a_job_sharing_its_lock_lives(tmp_path):
    inputs = (tmp_path, "digits", "config-id", "data-md5", 2)
    base, fd = claim_train_dir(*inputs)
    job = os.fork()
    if job == 0:  # stands for the torchrun job, which inherits the lock
        try:
            time.sleep(60)
        finally:
            os._exit(0)
    try:
        release(fd)  # the claiming run lets go first (it ended, or was killed)
        second, fd2 = claim_train_dir(*inputs)
        release(fd2)
        assert second != base, "a second run was handed the folder of a live job"
    finally:
        os.kill(job, signal.SIGKILL)
        os.waitpid(job, 0)
    third, fd3 = claim_train_dir(*inputs)  # the job is gone: the inputs' own folder is free again
    release(fd3)
    assert third == base


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


def test_a_worker_with_an_input_error_waits_for_its_launcher_then_dies_at_its_sigterm(monkeypatch):
    """After writing fatal.json a worker holds on until its launcher stops the job (so torchrun does
    not restart the group into the same error first); the launcher's SIGTERM ends it at once, and
    without a launcher, or once it is gone, it does not wait."""
    import subprocess
    import sys

    from training.agent import LAUNCHER_PID_ENV
    from training.launcher import await_stop_after_fatal

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.delenv(LAUNCHER_PID_ENV, raising=False)
    t0 = time.monotonic()
    await_stop_after_fatal(limit_s=10)
    monkeypatch.setenv(LAUNCHER_PID_ENV, str(dead.pid))
    await_stop_after_fatal(limit_s=10)
    assert time.monotonic() - t0 < 5  # neither waited out its 10 s

    code = ("import os, signal, sys; signal.signal(signal.SIGTERM, lambda *a: None); "
            "from training.launcher import await_stop_after_fatal; "
            "print('holding', flush=True); await_stop_after_fatal(limit_s=30); print('returned')")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})
    assert worker.stdout.readline().strip() == "holding"
    time.sleep(0.3)
    assert worker.poll() is None  # its launcher (this process) lives: it holds
    worker.send_signal(signal.SIGTERM)  # its own handler (the preemption one, here a no-op) is gone
    assert worker.wait(timeout=5) == -signal.SIGTERM
    assert worker.stdout.read() == ""
