"""Who owns a RUNNING MLflow run, and when its owner is known to be gone (registry.orphans)."""

from __future__ import annotations

import os
from pathlib import Path

from registry.lease import host_id
from registry.orphans import OWNER_HOST_TAG, OWNER_PID_TAG, gone_reason, owner_tags, process_start


def test_this_process_owns_its_runs_and_is_alive():
    tags = owner_tags()
    assert tags[OWNER_HOST_TAG] == host_id() and tags[OWNER_PID_TAG] == f"{os.getpid()}:{process_start(os.getpid())}"
    assert gone_reason(tags, host_id()) is None


def test_a_dead_pid_on_this_host_is_gone():
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have it
    reason = gone_reason({OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: f"{dead}:123"}, host_id())
    assert reason == f"its process (pid {dead} on this host) is gone"


def test_a_pid_used_again_by_another_process_is_gone():
    tags = {OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: f"{os.getpid()}:1"}  # this pid, another start time
    assert "belongs to another process now" in gone_reason(tags, host_id())


def test_another_hosts_run_and_a_run_without_an_owner_are_left_alone():
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert gone_reason({OWNER_HOST_TAG: "elsewhere", OWNER_PID_TAG: f"{dead}:1"}, host_id()) is None
    assert gone_reason({}, host_id()) is None
    assert gone_reason({OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: "nonsense"}, host_id()) is None
