"""What ties a training job's processes to the run that started them, with real processes: a
parent-death signal, a folder lock shared with the job (fork only, no exec), and a worker that
holds on for its launcher's SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from core.locks import release
from core.procs import die_with_parent, pid_alive
from tests.waiting import wait_for
from training.slots import claim_train_dir

pytestmark = pytest.mark.integration


def _fork_until_eof(read_fd: int, write_fd: int) -> int:
    """A child that stays alive until the pipe ``read_fd`` reaches end of file (its writer, the test,
    closes ``write_fd`` or dies), then exits."""
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_fd)
            os.read(read_fd, 1)
        finally:
            os._exit(0)
    return pid


def test_a_process_bound_to_its_parent_dies_when_the_parent_is_killed():
    r, w = os.pipe()
    hold_r, hold_w = os.pipe()  # the stand-in launcher and its bound child live until this closes
    parent = os.fork()
    if parent == 0:  # stands for the launcher: starts a bound child, then waits to be killed
        try:
            os.close(hold_w)
            if os.fork() == 0:
                bound = die_with_parent(signal.SIGKILL, os.getppid())
                os.write(w, f"{os.getpid()} {int(bound)}\n".encode())
            os.read(hold_r, 1)
        finally:
            os._exit(0)
    os.close(w)
    os.close(hold_r)
    with os.fdopen(r) as fh:
        child, bound = map(int, fh.readline().split())
    try:
        assert bound == 1
        assert pid_alive(child)
        os.kill(parent, signal.SIGKILL)
        os.waitpid(parent, 0)
        wait_for(lambda: not pid_alive(child), 30, "the bound child to die with its killed parent")
    finally:
        os.close(hold_w)  # the bound child, had it outlived its parent, reads end of file and exits
        for pid in (parent, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_folder_stays_claimed_while_a_job_sharing_its_lock_lives(tmp_path):
    inputs = (tmp_path, "digits", "config-id", "data-md5", 2)
    base, fd = claim_train_dir(*inputs)
    hold_r, hold_w = os.pipe()
    job = _fork_until_eof(hold_r, hold_w)  # stands for the torchrun job, which inherits the lock
    os.close(hold_r)
    try:
        release(fd)  # the claiming run lets go first (it ended, or was killed)
        second, fd2 = claim_train_dir(*inputs)
        release(fd2)
        assert second != base, "a second run was handed the folder of a live job"
    finally:
        os.close(hold_w)
        os.waitpid(job, 0)
    third, fd3 = claim_train_dir(*inputs)  # the job is gone: the inputs' own folder is free again
    release(fd3)
    assert third == base


def test_a_worker_with_an_input_error_waits_for_its_launcher_then_dies_at_its_sigterm():
    """After writing fatal.json a worker holds on until its launcher stops the job (so torchrun does
    not restart the group into the same error first), and the launcher's SIGTERM ends it at once.
    The worker says each time it looks at its launcher: two looks that found it alive, and no
    return, are the proof that it holds."""
    from training.agent import LAUNCHER_PID_ENV

    code = ("import signal; signal.signal(signal.SIGTERM, lambda *a: None)\n"
            "from training import launcher\n"
            "alive = launcher.pid_alive\n"
            "def looked(pid):\n"
            "    answer = alive(pid)\n"
            "    print('launcher alive' if answer else 'launcher gone', flush=True)\n"
            "    return answer\n"
            "launcher.pid_alive = looked\n"
            "launcher.await_stop_after_fatal(limit_s=600)\n"
            "print('returned', flush=True)\n")
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, LAUNCHER_PID_ENV: str(os.getpid())})
    try:
        assert worker.stdout.readline().strip() == "launcher alive"
        assert worker.stdout.readline().strip() == "launcher alive"  # it looked again: it holds
        worker.send_signal(signal.SIGTERM)  # its own handler (the preemption one, here a no-op) is gone
        assert worker.wait(timeout=60) == -signal.SIGTERM
        assert set(worker.stdout.read().split("\n")) <= {"launcher alive", ""}  # it never returned
    finally:
        worker.kill()
        worker.wait()
