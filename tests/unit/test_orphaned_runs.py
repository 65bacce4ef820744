"""Who owns a RUNNING MLflow run, and when its owner is known to be gone (registry.orphans)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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


def test_a_cluster_job_left_by_a_killed_run_is_cancelled_by_the_next_run_and_a_live_runs_is_not(tmp_path):
    import json

    from registry.orphans import JOBS_DIR, cancel_orphaned_jobs, forget_job, record_job

    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    record_job(tmp_path, "slurm", "41")  # this live process's job
    (tmp_path / JOBS_DIR / "slurm-42.json").write_text(json.dumps(
        {"launcher": "slurm", "job_id": "42", OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: f"{dead}:1"}))
    cancelled_ids: list[str] = []
    assert cancel_orphaned_jobs(tmp_path, {"slurm": cancelled_ids.append}) == ["slurm job 42"]
    assert cancelled_ids == ["42"]
    assert sorted(p.name for p in (tmp_path / JOBS_DIR).iterdir()) == ["slurm-41.json"]
    forget_job(tmp_path, "slurm", "41")
    assert not list((tmp_path / JOBS_DIR).iterdir())


def test_a_job_whose_cancel_fails_stays_recorded_for_the_next_run(tmp_path):
    import json

    from registry.orphans import JOBS_DIR, cancel_orphaned_jobs

    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    (tmp_path / JOBS_DIR).mkdir()
    (tmp_path / JOBS_DIR / "slurm-7.json").write_text(json.dumps(
        {"launcher": "slurm", "job_id": "7", OWNER_HOST_TAG: host_id(), OWNER_PID_TAG: f"{dead}:1"}))

    def unreachable(job_id: str) -> None:
        raise OSError("slurmctld unreachable")

    assert cancel_orphaned_jobs(tmp_path, {"slurm": unreachable}) == []
    assert (tmp_path / JOBS_DIR / "slurm-7.json").is_file()


def test_a_kubernetes_job_is_recorded_by_flavour_namespace_and_name_and_nothing_else(tmp_path):
    import json

    from registry.orphans import JOBS_DIR, cancel_orphaned_jobs, record_job

    record_job(tmp_path, "kubernetes", "job.ml.tf-digits-a1b2c3")
    record = json.loads((tmp_path / JOBS_DIR / "kubernetes-job.ml.tf-digits-a1b2c3.json").read_text())
    assert record["job_id"] == "job.ml.tf-digits-a1b2c3"
    for bad in ("../x", "job.ml", "job.ml.a/b", "job.ML.x"):
        with pytest.raises(ValueError, match="not a job id"):
            record_job(tmp_path, "kubernetes", bad)
    with pytest.raises(ValueError, match="not a job id"):
        record_job(tmp_path, "slurm", "job.ml.x")
    assert cancel_orphaned_jobs(tmp_path, {"kubernetes": lambda job_id: None}) == []  # its owner lives
