import os
import time
from pathlib import Path

from core.procs import pid_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not():
    assert pid_alive(os.getpid())
    child = os.fork()
    if child == 0:  # the child exits at once and stays a zombie until reaped below
        os._exit(0)
    try:
        stat = Path(f"/proc/{child}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().split(")")[-1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pid_alive(child)  # exited, not yet reaped: not alive
    finally:
        os.waitpid(child, 0)
    assert not pid_alive(child)  # reaped: gone


def test_stop_group_ends_the_leader_and_a_child_that_ignores_sigterm():
    import subprocess

    from core.procs import group_members, stop_group

    # The leader's child ignores SIGTERM: only the SIGKILL after the grace period ends it.
    leader = subprocess.Popen(["sh", "-c", "sh -c 'trap \"\" TERM; sleep 60' & sleep 60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(group_members(leader.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(group_members(leader.pid)) >= 3  # sh, sh (trapping), sleep
        assert stop_group(leader.pid, grace=0.3)
        assert group_members(leader.pid) == []
    finally:
        leader.kill()
        leader.wait()
