"""A torchrun worker for tests/fault/test_orphans.py: it records its pid, then ignores SIGTERM and
sleeps, as a rank hung in a collective does. Only SIGKILL ends it. ``main(argv)`` is the entry
point ``training.agent`` forks into (``-m tests.fault.stubborn_worker PIDS_DIR``)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from training.agent import bind_worker

    bind_worker()  # as training.worker does first: SIGKILL when the agent dies
    Path(argv[0], f"rank{os.environ.get('RANK', '0')}.pid").write_text(str(os.getpid()))
    time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
