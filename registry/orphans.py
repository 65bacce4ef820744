"""MLflow runs whose pipeline process died without ending them (SIGKILL, OOM, a lost host) stay
``RUNNING`` forever. Each run records its owner: this host and PID namespace (``lease.host_id``), the
pid, and the process's start time (so a pid used again by another process is not taken for it). The
next pipeline run on the same host marks the runs of its experiment whose owner is gone ``KILLED``.

A run owned by another host is left alone: whether its process lives cannot be told from here, and a
live run must never be ended by another. It is marked by the next run on its own host.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from core.procs import pid_alive
from registry.lease import host_id
from registry.store import client, end_run, set_tags

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


# -- cluster jobs (Slurm, Kubernetes) of runs that died -------------------------------------------------------
# A cluster job outlives a SIGKILLed run (its processes are not the run's children). Each run
# records its live jobs in the home's jobs/ folder with the same owner tags; the next run on that
# home cancels the jobs whose owner is gone.

JOBS_DIR = "jobs"


# A Kubernetes job's id: ``<flavour>.<namespace>.<name>`` (DNS labels have no dots).
_KUBE_JOB_ID = re.compile(r"^[a-z]+\.[a-z0-9-]{1,63}\.[a-z0-9-]{1,63}$")


def _job_file(home: Path, launcher: str, job_id: str) -> Path:
    ok = _KUBE_JOB_ID.match(job_id) if launcher == "kubernetes" else job_id.isdigit()
    if not ok or not launcher.isalpha():
        raise ValueError(f"not a job id: {launcher} {job_id!r}")
    return Path(home) / JOBS_DIR / f"{launcher}-{job_id}.json"


def record_job(home: Path, launcher: str, job_id: str) -> None:
    """Note that this process owns the cluster job ``job_id`` until ``forget_job``."""
    path = _job_file(home, launcher, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"launcher": launcher, "job_id": job_id, **owner_tags()}))


def forget_job(home: Path, launcher: str, job_id: str) -> None:
    _job_file(home, launcher, job_id).unlink(missing_ok=True)


def cancel_orphaned_jobs(home: Path, cancellers: dict[str, Callable[[str], None]]) -> list[str]:
    """Cancel each recorded job whose owning run on this host is gone (``cancellers[launcher](job_id)``);
    returns ``<launcher> job <id>`` of each, and logs why. Jobs of live runs and other hosts stay."""
    here, cancelled = host_id(), []
    for path in sorted((Path(home) / JOBS_DIR).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            launcher, job_id = record["launcher"], str(record["job_id"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        reason = gone_reason(record, here)
        if reason is None or launcher not in cancellers:
            continue
        try:
            cancellers[launcher](job_id)
        except Exception as exc:  # noqa: BLE001 - bookkeeping of another run: must not fail this one
            log.warning("could not cancel %s job %s left by a run that is gone: %s", launcher, job_id, exc)
            continue
        path.unlink(missing_ok=True)
        log.warning("%s job %s was left by a run that is gone (%s): cancelled", launcher, job_id, reason)
        cancelled.append(f"{launcher} job {job_id}")
    return cancelled
