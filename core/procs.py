"""Processes, by pid, and tying a child's life to its parent's (stdlib only)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (exited, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process, alive
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True  # no /proc here: existing is all we can tell


def _prctl():
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(sig: int, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux ``PR_SET_PDEATHSIG``).

    "Its parent" is the *thread* that started this process, and the signal may come again as the
    process passes to other threads of a dying parent: a handler must expect repeats. ``parent``:
    the pid that started this process. False when it is no longer the parent (it exited before
    the request: the signal will never come, the caller should exit); True otherwise and off Linux.
    """
    if sys.platform != "linux":
        return True
    if _prctl()(PR_SET_PDEATHSIG, int(sig)) != 0:
        return True  # not granted (a sandbox): nothing more to do here
    return parent is None or os.getppid() == parent


def parent_death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when the calling thread ends
    (a child whose parent is gone already exits at once). None off Linux. libc's ``prctl`` is looked
    up here, in the parent: between fork and exec the child only calls it."""
    if sys.platform != "linux":
        return None
    prctl, parent = _prctl(), os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig))
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def children(pid: int) -> list[int]:
    """Child pids of ``pid``'s main thread (Linux ``/proc``; [] when it is gone, or elsewhere)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group ``pgid`` (Linux ``/proc``; [] elsewhere)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


def stop_group(pgid: int, grace: float = 15.0) -> bool:
    """SIGTERM process group ``pgid``, SIGKILL what is left of it after ``grace`` seconds; True once
    no live process is left in it. The caller must own the group: its leader is its child, not yet
    reaped (until reaped, no other process can take the group id)."""
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return True
            time.sleep(0.1)
    return not group_members(pgid)
