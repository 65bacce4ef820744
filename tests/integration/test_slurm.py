"""The Slurm launcher against a real two-node Slurm on loopback (tests/slurm_cluster.py): a rendered
job trains one world across n1 and n2 and is followed to COMPLETED; a cancelled job ends CANCELLED
with no process of it left. (The rendered script itself: tests/unit/test_slurm.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import load_config
from core.manifest import read_dvc_file
from tests.engine_helpers import free_port
from tests.slurm_cluster import poll
from training import slurm
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.integration
JOB_LIMIT_S = 180


def submit(cluster, repo_root: Path, out: Path, *overrides: str) -> str:
    """A trainflow training job of digits over n1 and n2 (one CPU worker each), submitted; its id."""
    cfg = load_config(repo_root / "tests/configs/digits-engine.yaml",
                      ["training.cpu_workers=1", f"launcher.slurm.rdzv_port={free_port()}", *overrides])
    plan = plan_launch(cfg, HostFacts(), nproc=1, nnodes=2)
    md5 = read_dvc_file(repo_root, cfg.dataset.dvc_file).md5
    return slurm.submit(slurm.dry_run(plan, out, repo_root, md5, comment="test"), cluster.env)


def follow(cluster, job_id: str, until, limit_s: float = JOB_LIMIT_S) -> list[slurm.SlurmStatus]:
    """Every distinct status ``describe`` reports until ``until(status)``."""
    seen: list[slurm.SlurmStatus] = []

    def check():
        status = slurm.describe(job_id, cluster.env)
        if status and (not seen or status != seen[-1]):
            seen.append(status)
        return status and until(status)

    try:
        poll(check, limit_s, f"job {job_id}", every_s=0.2)
    except TimeoutError:
        slurm.cancel(job_id, cluster.env)
        raise
    return seen


def job_processes(job_id: str) -> list[tuple[int, str]]:
    """(pid, command line) of this host's processes of the job: its steps' slurmstepd and every
    process that carries the job id in its environment (the batch shell, the agents, the workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (f"SLURM_JOB_ID={job_id}".encode() in environ
                             or cmdline.startswith(f"slurmstepd: [{job_id}.")):
            found.append((int(entry.name), cmdline))
    return found


def test_a_rendered_job_trains_one_world_across_both_nodes_and_is_followed_to_completed(
        slurm_cluster, bundled_data, repo_root, tmp_path):
    out = tmp_path / "run"
    job_id = submit(slurm_cluster, repo_root, out, "training.epochs=1")
    seen = follow(slurm_cluster, job_id, lambda s: s.ended)
    final = seen[-1]
    log = (out / f"slurm-{job_id}.out").read_text()
    assert (final.state, final.exit_code) == ("COMPLETED", "0:0"), log[-3000:]
    assert final.nodes == ("n1", "n2")
    assert any(s.state == "RUNNING" and s.nodes == ("n1", "n2") for s in seen), seen
    assert {s.state for s in seen} <= {"PENDING", "RUNNING", "COMPLETED"}, seen
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["world_size"] == 2, result
    # One task per node: each slurmd launched the job's step.
    for node in ("n1", "n2"):
        assert f"launch task StepId={job_id}.0" in (slurm_cluster.root / "log" / f"slurmd-{node}.log").read_text()
    assert (out / "config.yaml").is_file() and (out / slurm.SCRIPT_NAME).is_file()


def test_a_cancelled_job_ends_cancelled_with_no_process_of_it_left(slurm_cluster, bundled_data, repo_root, tmp_path):
    job_id = submit(slurm_cluster, repo_root, tmp_path / "run", "training.epochs=500")

    def agents_up():  # both nodes' torchrun agents started: the job is running, not just allocated
        return sum("training.agent" in cmd for _, cmd in job_processes(job_id)) >= 2

    try:
        poll(agents_up, JOB_LIMIT_S, f"job {job_id}'s two torchrun agents")
    except TimeoutError:
        slurm.cancel(job_id, slurm_cluster.env)
        raise
    assert slurm.describe(job_id, slurm_cluster.env).state == "RUNNING"
    slurm.cancel(job_id, slurm_cluster.env)
    seen = follow(slurm_cluster, job_id, lambda s: s.ended, limit_s=60)
    assert seen[-1].state == "CANCELLED", seen
    poll(lambda: not job_processes(job_id), 60, f"job {job_id}'s processes to exit")
    slurm.cancel(job_id, slurm_cluster.env)  # an ended job: nothing to do, no error


@pytest.mark.parametrize("overrides, nnodes, words", [
    ((), 3, "Batch job submission failed: More processors requested than permitted"),
    (("launcher.slurm.partition=nosuch",), 2, "invalid partition"),
])
def test_a_request_slurm_can_never_run_is_refused_with_slurms_reason(slurm_cluster, repo_root, tmp_path,
                                                                     overrides, nnodes, words):
    cfg = load_config(repo_root / "tests/configs/digits-engine.yaml", ["training.cpu_workers=1", *overrides])
    request = slurm.dry_run(plan_launch(cfg, HostFacts(), nproc=1, nnodes=nnodes), tmp_path / "run", repo_root, "md5")
    with pytest.raises(slurm.SlurmError, match=words) as err:
        slurm.submit(request, slurm_cluster.env)
    assert "\n" not in str(err.value)
    assert slurm_cluster.run("squeue", "-h").stdout == ""  # nothing queued


def test_a_job_whose_workers_fail_ends_failed(slurm_cluster, bundled_data, repo_root, tmp_path):
    out = tmp_path / "run"
    job_id = submit(slurm_cluster, repo_root, out, "training.max_restarts=0", "dataset.path=data/nosuch")
    final = follow(slurm_cluster, job_id, lambda s: s.ended)[-1]
    assert (final.state, final.nodes) == ("FAILED", ("n1", "n2")), final
    assert final.exit_code != "0:0"
    assert "nosuch" in (out / f"slurm-{job_id}.out").read_text()
