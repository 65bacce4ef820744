"""SIGTERM as a request to stop cleanly, in the worker and in the launcher.

Worker side: ``StopRequest`` turns SIGTERM into a flag; the trainer agrees on it
across ranks at the next agreement check (every ``preempt_check_steps``), checkpoints and exits with status
``preempted``. Launcher side: ``REQUESTED`` is an event any thread can wait on;
``install_handler`` (main thread only) sets it on SIGTERM, so a launcher running
in a worker thread (a Prefect task) still sees the signal its process received.
The launcher treats SIGHUP (its terminal closed) the same way: the job checkpoints
and the command exits as preempted, rather than dying and leaving the job behind.
"""

from __future__ import annotations

import signal
import threading

REQUESTED = threading.Event()
# What the launcher takes as a request to preempt its job.
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def install_handler() -> bool:
    """Make SIGTERM and SIGHUP set ``REQUESTED`` in this process. False when not on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in SIGNALS:
        signal.signal(sig, lambda *_: REQUESTED.set())
    return True


class StopRequest:
    """Worker-side flag set by SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, *_):
        self.requested = True
