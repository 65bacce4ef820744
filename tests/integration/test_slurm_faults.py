"""The Slurm launcher's faults on a real two-node Slurm on loopback (tests/slurm_cluster.py), through
`trainflow train --launcher slurm` as a user runs it on a login node: SIGTERM of the run cancels
its job; a SIGKILLed rank is restarted by torchrun and the weights equal an undisturbed run's. (The
warning signal, through a whole `trainflow run`: test_slurm.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN
from tests.integration.test_slurm import JOB_LIMIT_S, job_processes, slurm_args
from tests.slurm_cluster import poll
from training import slurm

pytestmark = pytest.mark.integration


def train_cli(cluster, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`trainflow train --launcher slurm` on both nodes, as a user starts it on the login node (the
    job gets this environment: sbatch exports it)."""
    cmd = [str(VENV_BIN / "trainflow"), "train", "--config", "tests/configs/digits-engine.yaml", "--out", str(out),
           *slurm_args(*extra)]
    return subprocess.Popen(cmd, cwd=Path(__file__).parents[2], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**cluster.env, "TRAINFLOW_HOME": str(out.parent / "home"), **(env or {})})


def job_of(out: Path) -> str:
    return poll(lambda: next((p.stem.split("-")[1] for p in out.glob("slurm-*.out") if p.stem.count("-") == 1), None),
                JOB_LIMIT_S, f"a batch log in {out}")


def test_the_run_stopped_with_sigterm_cancels_its_job_and_leaves_no_process(slurm_cluster, bundled_data, tmp_path):
    out = tmp_path / "run"
    proc = train_cli(slurm_cluster, out, "--set", "training.epochs=500")
    try:
        job_id = job_of(out)
        poll(lambda: sum("training.agent" in cmd for _, cmd in job_processes(job_id)) >= 2, JOB_LIMIT_S,
             f"job {job_id}'s two torchrun agents")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 4, err[-3000:]
    assert f"stopped: Slurm job {job_id} cancelled with the run" in err
    assert slurm.describe(job_id, slurm_cluster.env).state == "CANCELLED"
    poll(lambda: not job_processes(job_id), 60, f"job {job_id}'s processes to exit")


# A checkpoint every 10 steps (21 a epoch); rank 1 SIGKILLs itself at step 25 (training.faults).
FAULT_JOB = ("--set", "training.epochs=3", "--set", "training.checkpoint_every_steps=10",
             "--set", "training.keep_checkpoints=5")


def test_one_rank_sigkilled_is_restarted_and_the_weights_equal_an_undisturbed_runs(slurm_cluster, bundled_data,
                                                                                   tmp_path):
    # Both submitted at once: Slurm runs them one after the other on the two nodes.
    clean = train_cli(slurm_cluster, tmp_path / "clean" / "out", *FAULT_JOB)
    killed = train_cli(slurm_cluster, tmp_path / "killed" / "out", *FAULT_JOB,
                       env={"TRAINFLOW_FAULT": "kill@step=25,rank=1"})
    try:
        errs = [p.communicate(timeout=3 * JOB_LIMIT_S)[1] for p in (clean, killed)]
    finally:
        for p in (clean, killed):
            if p.poll() is None:
                p.kill()
    assert (clean.returncode, killed.returncode) == (0, 0), errs[1][-3000:]
    ok, r = (json.loads((tmp_path / d / "out" / "result.json").read_text()) for d in ("clean", "killed"))
    assert (r["world_size"], r["restarts"]) == (2, 1) and 0 < r["resumed_from_step"] < 25, r
    assert r["weights_sha256"] == ok["weights_sha256"] and r["steps"] == ok["steps"]


# A login-node process that submits a job, records it in its home as the pipeline's train stage
# does (flows.pipeline._job_hooks), and follows it.
SUBMITTER = """
import sys
from pathlib import Path
from core.config import load_config
from core.manifest import read_dvc_file
from registry.orphans import record_job
from training.launchers import Hooks, launcher_for
from training.plan import HostFacts, plan_launch

home, port = Path(sys.argv[1]), sys.argv[2]
cfg = load_config("tests/configs/digits-engine.yaml",
                  ["training.cpu_workers=1", "training.epochs=500", f"launcher.slurm.rdzv_port={port}"])
md5 = read_dvc_file(Path.cwd(), cfg.dataset.dvc_file).md5
hooks = Hooks(submitted=lambda job_id: record_job(home, "slurm", job_id))
launcher_for("slurm").start(plan_launch(cfg, HostFacts(), nproc=1, nnodes=2), home / "run", Path.cwd(), md5,
                            hooks=hooks).finish()
"""


def test_a_job_left_by_a_sigkilled_run_is_cancelled_by_the_next_run_on_that_home(slurm_cluster, bundled_data,
                                                                                   tmp_path):
    from registry.orphans import JOBS_DIR, cancel_orphaned_jobs
    from tests.engine_helpers import free_port

    home = tmp_path / "home"
    proc = subprocess.Popen([str(VENV_BIN / "python"), "-c", SUBMITTER, str(home), str(free_port())],
                            cwd=Path(__file__).parents[2], env=slurm_cluster.env, stderr=subprocess.PIPE, text=True)
    try:
        record = poll(lambda: next((home / JOBS_DIR).glob("slurm-*.json"), None) if (home / JOBS_DIR).is_dir()
                      else None, JOB_LIMIT_S, "the job's record in the home")
        job_id = record.stem.removeprefix("slurm-")
        poll(lambda: sum("training.agent" in cmd for _, cmd in job_processes(job_id)) >= 2, JOB_LIMIT_S,
             f"job {job_id}'s two torchrun agents")
        proc.kill()  # SIGKILL while it trains: no chance to cancel its job
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not slurm.describe(job_id, slurm_cluster.env).ended  # the job outlived its run
    assert cancel_orphaned_jobs(home, {"slurm": lambda j: slurm.cancel(j, slurm_cluster.env)}) == [f"slurm job {job_id}"]
    poll(lambda: slurm.describe(job_id, slurm_cluster.env).state == "CANCELLED", 60, f"job {job_id} cancelled")
    poll(lambda: not job_processes(job_id), 60, f"job {job_id}'s processes to exit")
    assert not record.exists()
