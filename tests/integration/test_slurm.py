"""The Slurm launcher against a real two-node Slurm on loopback (tests/slurm_cluster.py): a rendered
job trains one world across n1 and n2 and is followed to COMPLETED; a cancelled job ends CANCELLED
with no process of it left; `trainflow run --launcher slurm` validates, trains on both nodes through
the warning signal (checkpoint, requeue, resume, each sample once an epoch) and registers, and
refuses what Slurm can never run; Slurm's REST API (a real slurmrestd) submits, follows, cancels
and refuses as sbatch does. (Faults: test_slurm_faults.py; the rendered
script: tests/unit/test_slurm.py.)"""

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


@pytest.fixture
def slurm_rest(slurm_cluster, monkeypatch):
    """``launcher.slurm.rest`` for the test cluster's own slurmrestd, with a JWT in $SLURM_JWT."""
    import getpass

    from core.config import SlurmRestConfig
    from tests import slurm_cluster as cluster

    if cluster.restd_missing():
        pytest.skip("the Slurm REST API tests need slurmrestd: apt-get install -y slurmrestd (as root) enables them")
    with cluster.slurmrestd(slurm_cluster) as url:
        monkeypatch.setenv("SLURM_JWT", cluster.token(slurm_cluster, getpass.getuser()))
        yield SlurmRestConfig(url=url)


def submit(cluster, repo_root: Path, out: Path, *overrides: str, rest=None) -> str:
    """A trainflow training job of digits over n1 and n2 (one CPU worker each), submitted (with
    ``sbatch``, or through ``rest``); its id."""
    cfg = load_config(repo_root / "tests/configs/digits-engine.yaml",
                      ["training.cpu_workers=1", f"launcher.slurm.rdzv_port={free_port()}", *overrides])
    plan = plan_launch(cfg, HostFacts(), nproc=1, nnodes=2)
    md5 = read_dvc_file(repo_root, cfg.dataset.dvc_file).md5
    return slurm.submit(slurm.dry_run(plan, out, repo_root, md5, comment="test"), cluster.env, rest)


def follow(cluster, job_id: str, until, limit_s: float = JOB_LIMIT_S, rest=None) -> list[slurm.SlurmStatus]:
    """Every distinct status ``describe`` reports until ``until(status)``."""
    seen: list[slurm.SlurmStatus] = []

    def check():
        status = slurm.describe(job_id, cluster.env, rest)
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


def test_a_rendered_job_submitted_through_the_rest_api_trains_one_world_across_both_nodes_to_completed(
        slurm_cluster, slurm_rest, bundled_data, repo_root, tmp_path):
    out = tmp_path / "run"
    job_id = submit(slurm_cluster, repo_root, out, "training.epochs=1", rest=slurm_rest)
    seen = follow(slurm_cluster, job_id, lambda s: s.ended, rest=slurm_rest)
    assert slurm.describe(job_id, slurm_cluster.env) == seen[-1]  # scontrol says what the REST API says
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
    # The #SBATCH lines became the job's properties (slurmrestd does not read them).
    shown = slurm_cluster.run("scontrol", "show", "job", "-o", job_id).stdout
    assert all(f" {field} " in f" {shown} " for field in ("Comment=test", "Requeue=1", "TimeLimit=01:00:00",
                                                          f"StdOut={out}/slurm-{job_id}.out")), shown


def test_the_rest_api_refuses_with_slurms_reason_cancels_and_names_no_token(slurm_cluster, slurm_rest, repo_root,
                                                                            tmp_path, monkeypatch):
    from dataclasses import replace

    def request(nnodes: int, *overrides: str) -> slurm.SlurmRequest:
        cfg = load_config(repo_root / "tests/configs/digits-engine.yaml", ["training.cpu_workers=1", *overrides])
        return slurm.dry_run(plan_launch(cfg, HostFacts(), nproc=1, nnodes=nnodes), tmp_path / "run", repo_root, "md5")

    for refused, reason in ((request(3), "More processors requested than permitted"),
                            (request(2, "launcher.slurm.partition=nosuch"), "Invalid partition name specified")):
        with pytest.raises(slurm.SlurmRefusedError, match=f"^{reason}$"):
            slurm.submit(refused, slurm_cluster.env, slurm_rest)
    assert slurm_cluster.run("squeue", "-h").stdout == ""
    # A job that runs until it is cancelled.
    job_id = slurm.submit(replace(request(2), script="#!/bin/bash\nexec tail -f /dev/null\n"), slurm_cluster.env,
                          slurm_rest)
    try:
        running = follow(slurm_cluster, job_id, lambda s: s.state == "RUNNING", rest=slurm_rest)[-1]
        assert running.nodes == ("n1", "n2")
    finally:
        slurm.cancel(job_id, rest=slurm_rest)
    assert follow(slurm_cluster, job_id, lambda s: s.ended, limit_s=60, rest=slurm_rest)[-1].state == "CANCELLED"
    poll(lambda: not job_processes(job_id), 60, f"job {job_id}'s processes to exit")
    slurm.cancel(job_id, rest=slurm_rest)  # an ended job: nothing to do, no error
    assert slurm.describe("999999", rest=slurm_rest) is None
    monkeypatch.setenv("SLURM_JWT", "not-a-token-of-this-cluster")
    with pytest.raises(slurm.SlurmError) as err:
        slurm.describe(job_id, rest=slurm_rest)
    assert "not-a-token" not in str(err.value) and "\n" not in str(err.value)


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
    assert "nosuch" in "".join(p.read_text() for p in out.glob(f"slurm-{job_id}*.out"))


def test_a_job_pending_past_the_queue_limit_is_cancelled_with_one_line(slurm_cluster, bundled_data, repo_root,
                                                                       tmp_path, monkeypatch):
    from core.errors import TrainingFailedError
    from training.launchers import Hooks, launcher_for

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    # Another user's job holds both nodes until it is cancelled.
    blocker = slurm_cluster.run("sbatch", "--parsable", "-N2", f"--output={tmp_path}/blocker.out",
                                "--wrap", "exec tail -f /dev/null").stdout.strip()
    try:
        cfg = load_config(repo_root / "tests/configs/digits-engine.yaml",
                          ["training.cpu_workers=1", "launcher.slurm.queue_limit_s=1"])
        md5 = read_dvc_file(repo_root, cfg.dataset.dvc_file).md5
        lines: list[str] = []
        job = launcher_for("slurm").start(plan_launch(cfg, HostFacts(), nproc=1, nnodes=2), tmp_path / "run", repo_root,
                                          md5, hooks=Hooks(log=lines.append))
        with pytest.raises(TrainingFailedError, match=rf"^Slurm job {job.job_id} still PENDING \((Resources|Priority)\) "
                                                      r"after launcher.slurm.queue_limit_s=1: cancelled$"):
            job.finish()
        assert slurm.describe(job.job_id).state == "CANCELLED"
        assert any(line.startswith(f"Slurm job {job.job_id}: PENDING (") for line in lines), lines
    finally:
        slurm_cluster.run("scancel", blocker)
        # Gone before the cluster may stop: a job step outliving its slurmd would never exit.
        poll(lambda: not job_processes(blocker), 60, f"job {blocker}'s processes to exit")


def test_a_rank_that_crashes_fails_the_run_naming_its_node_rank_and_traceback(slurm_cluster, bundled_data, repo_root,
                                                                               tmp_path, monkeypatch):
    from core.errors import TrainingFailedError
    from training.launchers import Hooks, launcher_for

    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    cfg = load_config(repo_root / "tests/configs/digits-engine.yaml",
                      ["training.cpu_workers=1", "training.max_restarts=0", f"launcher.slurm.rdzv_port={free_port()}"])
    md5 = read_dvc_file(repo_root, cfg.dataset.dvc_file).md5
    lines: list[str] = []
    job = launcher_for("slurm").start(plan_launch(cfg, HostFacts(), nproc=1, nnodes=2), tmp_path / "run", repo_root, md5,
                                      {"TRAINFLOW_FAULT": "raise@step=3,rank=1"}, hooks=Hooks(log=lines.append))
    with pytest.raises(TrainingFailedError) as err:
        job.finish()
    # Which node hosts rank 1 is c10d's choice (arrival order): either, named.
    assert err.value.rank == 1, str(err.value)
    assert str(err.value).startswith(f"Slurm job {job.job_id} FAILED on node n") and " rank 1: " in str(err.value)
    assert "injected fault on rank 1 at step 3" in str(err.value) and "\n" not in str(err.value)
    assert "InjectedFault" in err.value.traceback
    assert any(line.startswith(f"Slurm job {job.job_id}: RUNNING on n1, n2") for line in lines), lines


# -- the pipeline and the CLI with --launcher slurm --------------------------------------------------

def slurm_args(*extra: str) -> list[str]:
    return ["--launcher", "slurm", "--nnodes", "2", "--nproc", "1", "--set", "training.cpu_workers=1",
            "--set", f"launcher.slurm.rdzv_port={free_port()}", *extra]


@pytest.fixture
def on_cluster(slurm_cluster, tmp_path, monkeypatch, clean_env, repo_root):
    """This process as a login node of the test cluster, with a fresh TRAINFLOW_HOME."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(repo_root)
    return slurm_cluster


def run_cli(args: list[str], tmp_path: Path) -> tuple[int, dict]:
    from flows.cli import main

    out = tmp_path / "summary.json"
    code = main(["run", "--config", "tests/configs/digits-quick.yaml", *args, "--summary-json", str(out)])
    return code, json.loads(out.read_text())


def test_run_with_the_slurm_launcher_trains_one_world_on_both_nodes_through_the_warning_signal_and_registers(
        prefect_api, on_cluster, bundled_data, repo_root, tmp_path, monkeypatch):
    """Validated, trained across n1 and n2, given the warning signal: checkpointed, requeued, resumed
    with each sample once an epoch, registered; the job in the summary and on the MLflow run."""
    import threading
    from collections import Counter

    from mlflow.tracking import MlflowClient

    from training.data import load_splits
    from training.faults import IDS_ENV, read_recorded_ids
    from training.goodput import LEDGER_FILE, read_events

    ids, epochs = tmp_path / "ids", 3
    monkeypatch.setenv(IDS_ENV, str(ids))  # the job gets the run's environment: sbatch exports it
    # Rank 0 paced: the signal sent after the first step lands while the job still trains.
    monkeypatch.setenv("TRAINFLOW_FAULT", "slow@step=1,rank=0,ms=100")
    signalled: list[str] = []

    def warn_once_training():  # what --signal=TERM@S does before the time limit: TERM to every step of the job
        poll(lambda: read_recorded_ids(ids) if ids.is_dir() else None, JOB_LIMIT_S, "the job's first step")
        signalled.append(on_cluster.run("squeue", "-h", "-o", "%i").stdout.split()[0])
        on_cluster.run("scancel", "--signal=TERM", signalled[0])

    thread = threading.Thread(target=warn_once_training, daemon=True)
    thread.start()
    code, summary = run_cli(slurm_args("--set", f"training.epochs={epochs}", "--set", "training.preempt_check_steps=1"),
                            tmp_path)
    thread.join(timeout=10)
    assert code == 0 and summary["status"] == "registered", summary.get("error")
    assert summary["validation"]["success"] and summary["model_version"]
    job, folder = summary["training"]["launcher"], Path(summary["train_dir"])
    assert [job["job_id"]] == signalled and summary["training"]["world_size"] == 2
    assert (job["name"], job["state"], job["nodes"], job["requeues"]) == ("slurm", "COMPLETED", ["n1", "n2"], 1)
    tags = MlflowClient().get_run(summary["mlflow_run_id"]).data.tags
    assert (tags["trainflow.slurm.job_id"], tags["trainflow.slurm.nodes"], tags["trainflow.slurm.state"]) == (
        job["job_id"], "n1,n2", "COMPLETED")
    # The job carries the run's ids; its record in the home is gone with it.
    comment = on_cluster.run("scontrol", "show", "job", "-o", job["job_id"]).stdout
    assert f"mlflow-run={summary['mlflow_run_id']}" in comment and f"flow-run={summary['prefect_flow_run_id']}" in comment
    assert not list((tmp_path / "home" / "jobs").glob("*.json"))
    result = json.loads((folder / "result.json").read_text())
    assert result["world_size"] == 2 and result["resumed_from_step"] > 0, result
    assert summary["training"]["resumed_from_step"] == result["resumed_from_step"]
    assert len(result["history"]) == epochs  # every epoch once: the requeued job went on where it stopped
    # The goodput ledger has the requeued job's attempt, from the step the signal's checkpoint holds.
    resumed = [ev for ev in read_events(folder / LEDGER_FILE) if ev["ev"] == "resume" and ev.get("step")]
    assert [ev["step"] for ev in resumed] == [result["resumed_from_step"]]
    records = read_recorded_ids(ids)
    assert sorted(rec["step"] for rec in records if rec["rank"] == 0) == list(range(1, result["steps"] + 1))
    n_train = len(load_splits(load_config(repo_root / "tests/configs/digits-quick.yaml"), repo_root, 0).train)
    for epoch in range(epochs):
        seen = Counter(i for rec in records if rec["epoch"] == epoch for i in rec["ids"])
        assert set(seen) == set(range(n_train)) and set(seen.values()) == {1}, f"epoch {epoch}"


def test_a_run_asking_for_more_nodes_than_the_partition_has_exits_2_with_slurms_reason_and_registers_nothing(
        prefect_api, on_cluster, bundled_data, tmp_path):
    args = slurm_args()
    args[args.index("--nnodes") + 1] = "3"
    code, summary = run_cli(args, tmp_path)
    assert code == 2 and summary["status"] == "failed", summary
    assert "More processors requested than permitted" in summary["error"] and "\n" not in summary["error"]
    assert summary["model_version"] is None
    assert on_cluster.run("squeue", "-h").stdout == ""


def test_a_shared_folder_that_does_not_exist_is_refused_before_submission(on_cluster, tmp_path, capsys):
    missing = tmp_path / "nosuch-shared"
    code, summary = run_cli(slurm_args("--set", f"launcher.slurm.shared_dir={missing}"), tmp_path)
    err = capsys.readouterr().err.strip()
    assert code == 1 and summary["status"] == "config_error", summary
    assert err == f"trainflow: error: launcher.slurm.shared_dir: {missing} does not exist here; the training folder " \
                  "must be on a path every node of the job sees"
    assert on_cluster.run("squeue", "-h").stdout == ""


def test_the_run_stopped_with_sigterm_cancels_its_job_exits_4_and_leaves_no_process(
        prefect_api, on_cluster, bundled_data, tmp_path):
    import os
    import signal
    import threading

    from mlflow.tracking import MlflowClient

    def sigterm_once_training():  # what a Prefect cancellation does to a process worker's run
        def agents_up():
            ids = on_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
            return ids and sum("training.agent" in cmd for _, cmd in job_processes(ids[0])) >= 2
        poll(agents_up, JOB_LIMIT_S, "the job's two torchrun agents")
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=sigterm_once_training, daemon=True)
    thread.start()
    code, summary = run_cli(slurm_args("--set", "training.epochs=500"), tmp_path)
    thread.join(timeout=10)
    assert code == 4 and summary["status"] == "preempted", summary.get("error")
    job_id = MlflowClient().get_run(summary["mlflow_run_id"]).data.tags["trainflow.slurm.job_id"]
    assert summary["error"].startswith(f"stopped: Slurm job {job_id} cancelled with the run")
    assert slurm.describe(job_id).state == "CANCELLED"
    poll(lambda: not job_processes(job_id), 60, f"job {job_id}'s processes to exit")
    assert not list((tmp_path / "home" / "jobs").glob("*.json"))
