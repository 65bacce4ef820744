"""SIGTERM as a request to stop cleanly: in the worker a flag the trainer agrees on across ranks
(``StopRequest``); in the launcher an event any thread (a Prefect task) can see, set on SIGTERM
and SIGHUP (a closed terminal checkpoints the job rather than leaving it behind)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

REQUESTED = threading.Event()
SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # what the launcher takes as a request to preempt its job


def install_handler() -> bool:
    """Make SIGTERM and SIGHUP set ``REQUESTED`` in this process. False when not on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in SIGNALS:
        signal.signal(sig, lambda *_: REQUESTED.set())
    return True


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """``install_handler`` for the block, and the handlers it replaced back after it."""
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    installed = install_handler()
    try:
        yield
    finally:
        if installed:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class StopRequest:
    """Worker-side flag set by SIGTERM."""

    def __init__(self) -> None:
        self.requested = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: setattr(self, "requested", True))
