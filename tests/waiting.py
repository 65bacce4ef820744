"""Waiting on an event (a file, a state, a log line, a process exit) with a deadline: a test that
must see something happen waits for it, never for a duration. The deadline only bounds a failure;
the test goes on the moment the event is seen."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

POLL_S = 0.02


def wait_for(predicate: Callable[[], T], timeout_s: float, what: str, poll_s: float = POLL_S) -> T:
    """``predicate()``'s first truthy answer, asked every ``poll_s`` seconds; AssertionError naming
    ``what`` (and the last answer) when none came within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        answer = predicate()
        if answer:
            return answer
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout_s:g} s waiting for {what} (last answer: {answer!r})")
        time.sleep(poll_s)


def wait_gone(pid: int, timeout_s: float, what: str = "") -> None:
    """Wait until process ``pid`` is no longer alive (exited, zombie or reaped)."""
    from core.procs import pid_alive

    wait_for(lambda: not pid_alive(pid), timeout_s, what or f"process {pid} to exit")
