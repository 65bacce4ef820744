"""SIGTERM as a request to stop cleanly, in the worker and in the launcher.

Worker side: ``StopRequest`` turns SIGTERM into a flag the trainer agrees on across ranks,
then checkpoints and ends with status ``preempted``. Launcher side: ``install_handler`` (main
thread only) sets ``REQUESTED``, which a launcher in a worker thread (a Prefect task) can see;
SIGHUP (its terminal closed) counts too, so the job checkpoints rather than being left behind.
"""

from __future__ import annotations

import signal
import threading

REQUESTED = threading.Event()
SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # what the launcher takes as a request to preempt its job


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
