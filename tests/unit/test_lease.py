"""Which promotion tickets still count: expired ones never; on this host, only a live process's."""

from __future__ import annotations

import os
import time
from pathlib import Path

from registry.lease import dead_reason, host_id, lock_name


def test_a_ticket_counts_until_it_expires_or_its_process_on_this_host_is_gone():
    here, now = host_id(), time.time()
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above the largest pid: never a process
    live = {"expires": str(now + 60), "host_id": here, "pid": str(os.getpid())}
    assert dead_reason(live, here, now) is None
    assert "expired" in dead_reason({**live, "expires": str(now - 5)}, here, now)
    assert "expired" in dead_reason({**live, "expires": "soon"}, here, now)
    assert f"pid {gone}" in dead_reason({**live, "pid": str(gone)}, here, now)
    # Another host's (or container's) pid says nothing here: only its expiry counts.
    assert dead_reason({**live, "pid": str(gone), "host_id": here + "-other"}, here, now) is None
    assert lock_name("digits-classifier") == "digits-classifier.promotion-lock"

