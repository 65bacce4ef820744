"""MLflow runs whose pipeline process died without ending them (SIGKILL, OOM, a lost host) stay
``RUNNING`` forever. Each run records its owner: this host and PID namespace (``lease.host_id``), the
pid, and the process's start time (so a pid used again by another process is not taken for it). The
next pipeline run on the same host marks the runs of its experiment whose owner is gone ``KILLED``.

A run owned by another host is left alone: whether its process lives cannot be told from here, and a
live run must never be ended by another. It is marked by the next run on its own host.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from core.procs import pid_alive
from registry.lease import host_id
from registry.store import STAGE_TAG, client, end_run, set_tags

log = logging.getLogger(__name__)

OWNER_HOST_TAG = "trainflow.owner_host"
OWNER_PID_TAG = "trainflow.owner_pid"  # "<pid>:<start time in clock ticks since boot>"
ORPHANED_TAG = "trainflow.orphaned"
KILLED_STAGE = "killed"


def process_start(pid: int) -> str:
    """The start time of ``pid`` (``/proc/<pid>/stat`` field 22), or "" where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_tags() -> dict[str, str]:
    """The tags that name this process as the owner of a run it starts or reopens."""
    pid = os.getpid()
    return {OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: f"{pid}:{process_start(pid)}"}


def gone_reason(tags: dict, here: str) -> str | None:
    """Why the owner of a RUNNING run with ``tags`` is known to be gone, else None (alive, another
    host's, or a run that names no owner)."""
    if tags.get(OWNER_HOST_TAG) != here:
        return None
    pid_text, _, started = tags.get(OWNER_PID_TAG, "").partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return None
    if not pid_alive(pid):
        return f"its process (pid {pid} on this host) is gone"
    if started and process_start(pid) not in ("", started):
        return f"its process (pid {pid} on this host) is gone; the pid belongs to another process now"
    return None


def mark_orphans_killed(experiment_id: str, current_run: str) -> list[str]:
    """End as ``KILLED`` each RUNNING run of ``experiment_id`` (but ``current_run``) whose owner on this
    host is gone; returns their ids. A store error only logs: it must not fail the run that asks."""
    here, ended = host_id(), []
    try:
        runs = client().search_runs([str(experiment_id)], filter_string="attributes.status = 'RUNNING'",
                                    max_results=1000)
        for run in runs:
            reason = gone_reason(run.data.tags, here)
            if run.info.run_id == current_run or reason is None:
                continue
            set_tags(run.info.run_id, {ORPHANED_TAG: f"marked KILLED by run {current_run}: {reason}"})
            end_run(run.info.run_id, "KILLED", KILLED_STAGE)
            log.warning("MLflow run %s was left RUNNING and %s: marked KILLED", run.info.run_id, reason)
            ended.append(run.info.run_id)
    except Exception as exc:  # noqa: BLE001 - bookkeeping of other runs
        log.warning("could not check for orphaned MLflow runs: %s", exc)
    return ended
