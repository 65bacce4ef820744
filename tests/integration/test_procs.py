"""core.procs with real processes: alive or not (a zombie is not), and a group stopped whole."""

import os
from pathlib import Path

import pytest

from core.procs import pid_alive
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def test_a_running_process_is_alive_and_an_exited_one_is_not():
    assert pid_alive(os.getpid())
    child = os.fork()
    if child == 0:  # the child exits at once and stays a zombie until reaped below
        os._exit(0)
    try:
        stat = Path(f"/proc/{child}/stat")
        wait_for(lambda: stat.read_text().split(")")[-1].split()[0] == "Z", 30, "the child to exit (a zombie)")
        assert not pid_alive(child)  # exited, not yet reaped: not alive
    finally:
        os.waitpid(child, 0)
    assert not pid_alive(child)  # reaped: gone


def _ignores_sigterm(pid: int) -> bool:
    import signal

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored >> (signal.SIGTERM - 1) & 1)


def test_stop_group_ends_the_leader_and_a_child_that_ignores_sigterm():
    import subprocess

    from core.procs import group_members, stop_group

    # The leader's child ignores SIGTERM: only the SIGKILL after the grace period ends it.
    leader = subprocess.Popen(["sh", "-c", "sh -c 'trap \"\" TERM; sleep 60' & sleep 60"], start_new_session=True)
    try:
        wait_for(lambda: len(group_members(leader.pid)) >= 3 and any(map(_ignores_sigterm, group_members(leader.pid))),
                 30, "sh, sh and sleep to start, one of them ignoring SIGTERM")
        assert stop_group(leader.pid, grace=0.3)
        assert group_members(leader.pid) == []
    finally:
        leader.kill()
        leader.wait()
