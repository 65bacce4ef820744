"""Advisory file locks (``flock``) between pipeline runs on one host or one shared filesystem.

A lock lives as long as its open file description: a run that dies leaves no stale lock, and a
child given the descriptor (``pass_fds``) shares it. POSIX only; NFS honours ``flock`` only on
Linux >= 2.6.12 with lock support.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class LockTimeoutError(TimeoutError):
    """The lock stayed taken for longer than the caller would wait."""


def try_lock(path: Path) -> int | None:
    """Take the exclusive lock on ``path`` (created if missing) without waiting: the descriptor that
    holds it (``release`` it), or None when another holder has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a curious human
    return fd


def release(fd: int | None) -> None:
    """Close this holder's descriptor; the lock is free once no process shares it any more (not
    ``LOCK_UN``: that would also unlock it for a child that inherited it, a training job)."""
    if fd is not None:
        os.close(fd)


def wait_lock(path: Path, timeout_s: float = 300.0, poll_s: float = 0.05) -> int:
    """Take the exclusive lock on ``path``, waiting up to ``timeout_s``: the descriptor that holds it
    (``release`` it); LockTimeoutError naming the file when it stays taken."""
    deadline = time.monotonic() + timeout_s
    while (fd := try_lock(path)) is None:
        if time.monotonic() > deadline:
            raise LockTimeoutError(f"{path}: still locked by another run after {timeout_s:g}s")
        time.sleep(poll_s)
    return fd


@contextmanager
def exclusive(path: Path, timeout_s: float = 300.0, poll_s: float = 0.05) -> Iterator[None]:
    """Hold the exclusive lock on ``path`` for the ``with`` block, waiting up to ``timeout_s``;
    LockTimeoutError naming the file when it stays taken."""
    fd = wait_lock(path, timeout_s, poll_s)
    try:
        yield
    finally:
        release(fd)
