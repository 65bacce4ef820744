"""``--launcher kubernetes`` through the launcher seam the train stage calls (``training.launchers``),
against the FAKE Kubernetes API server of ``tests.fake_kube`` (no cluster can run here): the job is
submitted with the run's labels, followed into the stage's hooks, its ending mapped as Slurm's, and
deleted when the run gets SIGTERM. The fake's script writes ``result.json`` into the shared folder
when it reports the job Complete, as the pods would on the shared volume."""

from __future__ import annotations

import json
import os
import signal

import pytest

from core.config import load_config
from core.errors import ConfigError, PreemptedError, TrainingFailedError
from tests.fake_kube import IMAGE, FakeKube, running, serve, terminated, use_kubeconfig
from training.launchers import Hooks, Labels, Kubernetes, cancel_kube_job, kube_job_id, launcher_for
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.integration
REPO = "https://git.example/ml/trainflow.git"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    with serve() as state:
        use_kubeconfig(state, tmp_path, monkeypatch)
        yield state


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """The volume's mount on this host; the home (and so the training folder) on it."""
    folder = tmp_path / "shared"
    (folder / "home").mkdir(parents=True)
    monkeypatch.setenv("TRAINFLOW_HOME", str(folder / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.ml.svc:5000")
    return folder


def _plan(repo_root, shared, *overrides: str):
    cfg = load_config(repo_root / "configs" / "digits.yaml",
                      ["training.cpu_workers=1", f"launcher.kubernetes.image={IMAGE}",
                       f"launcher.kubernetes.git_repo={REPO}", "launcher.kubernetes.namespace=ml",
                       "launcher.kubernetes.poll_s=0.01", f"launcher.kubernetes.shared_dir={shared}", *overrides])
    return plan_launch(cfg, HostFacts(), nproc=1, nnodes=2)


class Seen:
    """What the stage's hooks were told."""

    def __init__(self):
        self.lines, self.submitted, self.ended = [], [], []

    def hooks(self) -> Hooks:
        return Hooks(log=self.lines.append, submitted=self.submitted.append, ended=self.ended.append)


def _start(repo_root, shared, seen, *overrides):
    out = shared / "home" / "runs" / "digits-1"
    job = launcher_for("kubernetes").start(_plan(repo_root, shared, *overrides), out, repo_root, "md5",
                                           {"TRAINFLOW_SCORE": "1"}, labels=Labels("flow-1", "abc123"),
                                           hooks=seen.hooks())
    return job, out


def _job_name(fake: FakeKube) -> str:
    return next(b["metadata"]["name"] for m, p, _, b in fake.requests if m == "POST" and p.endswith("/jobs"))


def _script(fake: FakeKube, *steps) -> None:
    """``steps`` for the job the launcher creates (its name has a random part): set once it is posted."""
    original = fake.handle

    def handle(method, url, body):
        if method == "POST" and url.endswith("/jobs") and body["metadata"]["name"] not in fake.scripts:
            fake.scripts[body["metadata"]["name"]] = [step(body["metadata"]["name"]) for step in steps]
        return original(method, url, body)
    fake.handle = handle


def test_a_completed_job_returns_the_result_the_pods_wrote_to_the_shared_folder(fake, shared, repo_root):
    seen = Seen()
    result = {"status": "completed", "world_size": 2, "epochs_done": 3}

    def complete(job):
        def step(f):
            (shared / "home" / "runs" / "digits-1" / "result.json").write_text(json.dumps(result))
            for i, node in enumerate(("gpu-a", "gpu-b")):
                f.pod(job, i, "Succeeded", node, **terminated(0))
            f.condition(job, "Complete")
        return step
    _script(fake, running, complete)
    job, out = _start(repo_root, shared, seen)
    assert fake.requests == []  # checked and rendered; submitted by finish
    got = job.finish(at_result=True)

    name = _job_name(fake)
    created = fake.objects[fake.job_path(name)]
    labels = created["metadata"]["labels"]
    assert labels["trainflow/flow-run"] == "flow-1" and labels["trainflow/mlflow-run"] == "abc123"
    assert created["spec"]["template"]["metadata"]["labels"]["trainflow/mlflow-run"] == "abc123"
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--out") + 1] == "/shared/home/runs/digits-1"
    assert {"name": "TRAINFLOW_SCORE", "value": "1"} in container["env"]
    assert got["status"] == "completed" and got["epochs_done"] == 3 and got["out_dir"] == str(out)
    assert got["launcher"] == {"name": "kubernetes", "job_id": name, "job_ids": [name], "nodes": ["gpu-a", "gpu-b"],
                               "state": "COMPLETED", "requeues": 0}
    assert seen.submitted == seen.ended == [f"job.ml.{name}"]
    assert f"kubernetes: {name}: RUNNING on gpu-a, gpu-b" in seen.lines
    assert f"[{name}] rank 0: epoch 1 loss 0.91" in seen.lines
    assert seen.lines[-1] == f"kubernetes: job ml/{name} completed"


def test_a_failed_pod_fails_the_run_naming_pod_and_rank(fake, shared, repo_root):
    seen = Seen()

    def fail(job):
        def step(f):
            f.pod(job, 1, "Failed", "gpu-b", **terminated(1, "Error"))
            f.log(f"{job}-1-abcde", "Traceback (most recent call last):", "ValueError: NaN in row 17")
            f.condition(job, "Failed", "PodFailurePolicy")
        return step
    _script(fake, running, fail)
    job, _ = _start(repo_root, shared, seen)
    with pytest.raises(TrainingFailedError) as err:
        job.finish()
    name = _job_name(fake)
    assert str(err.value) == (f"job ml/{name} failed: pod {name}-1-abcde (node rank 1, on gpu-b) exited 1 (Error): "
                              "ValueError: NaN in row 17")
    assert err.value.rank == 1 and err.value.traceback.endswith("ValueError: NaN in row 17")
    assert seen.ended == [f"job.ml.{name}"]


def test_sigterm_deletes_the_job_with_foreground_propagation(fake, shared, repo_root):
    seen = Seen()
    # SIGTERM arrives while the job runs (the step runs in the server's thread; Python handles it in the main one).
    # A job not deleted would go on to Complete (without a result): the test fails rather than hangs.
    _script(fake, running, lambda job: lambda f: os.kill(os.getpid(), signal.SIGTERM),
            lambda job: lambda f: f.condition(job, "Complete"))
    before = signal.getsignal(signal.SIGTERM)
    job, _ = _start(repo_root, shared, seen)
    with pytest.raises(PreemptedError, match="deleted with the run"):
        job.finish()
    name = _job_name(fake)
    assert [(p, b) for m, p, _, b in fake.requests if m == "DELETE"] == [
        (fake.job_path(name), {"propagationPolicy": "Foreground"})]
    assert seen.ended == [f"job.ml.{name}"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_job_deleted_by_someone_else_is_one_line(fake, shared, repo_root):
    _script(fake, running, lambda job: lambda f: f.objects.pop(f.job_path(job)))
    job, _ = _start(repo_root, shared, Seen())
    with pytest.raises(TrainingFailedError) as err:
        job.finish()
    assert str(err.value) == f"job ml/{_job_name(fake)} was deleted by someone else; training stopped"


def test_an_orphaned_job_is_deleted_by_its_recorded_id(fake, shared, repo_root):
    from training import kube

    handle = kube.submit(kube.dry_run(_plan(repo_root, shared), name="tf-digits-abc", git_ref="0123abcd",
                                      data_md5="md5", mlflow_uri="http://mlflow.ml.svc:5000"), fake.client)
    cancel_kube_job(kube_job_id(handle))
    assert [(p, b) for m, p, _, b in fake.requests if m == "DELETE"] == [
        (fake.job_path("tf-digits-abc"), {"propagationPolicy": "Foreground"})]


def test_the_embedded_store_or_no_shared_folder_is_refused_before_anything_is_submitted(
        fake, shared, repo_root, monkeypatch):
    out = shared / "home" / "runs" / "digits-1"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(ConfigError, match="nodes cannot share a sqlite file"):
        Kubernetes().start(_plan(repo_root, shared), out, repo_root, "md5")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.ml.svc:5000")
    with pytest.raises(ConfigError) as err:
        Kubernetes().start(_plan(repo_root, shared, "launcher.kubernetes.shared_dir=null"), out, repo_root, "md5")
    assert str(err.value).startswith("launcher.kubernetes.shared_dir: required for --launcher kubernetes")
    with pytest.raises(ConfigError, match="is not inside"):
        Kubernetes().start(_plan(repo_root, shared), shared.parent / "elsewhere", repo_root, "md5")
    assert fake.requests == []


def test_trainflow_run_refuses_the_embedded_store_in_one_line(fake, shared, repo_root, monkeypatch, capsys, tmp_path):
    from flows.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    summary = tmp_path / "summary.json"
    code = main(["run", "--config", str(repo_root / "configs" / "digits.yaml"), "--launcher", "kubernetes",
                 "--nnodes", "2", "--nproc", "1", "--summary-json", str(summary),
                 "--set", f"launcher.kubernetes.shared_dir={shared}", "--set", f"launcher.kubernetes.image={IMAGE}",
                 "--set", f"launcher.kubernetes.git_repo={REPO}"])
    assert code == 1
    error = json.loads(summary.read_text())["error"]
    assert error == ("--launcher kubernetes: MLflow is the embedded sqlite store; the pods need a tracking server: "
                     "set MLFLOW_TRACKING_URI=http(s)://...")
    assert fake.requests == []


def test_a_job_out_of_time_is_resubmitted_in_the_goodput_ledger_then_stops_the_run_with_no_restart_left(
        fake, shared, repo_root):
    from training.goodput import LEDGER_FILE, read_events

    _script(fake, running, lambda job: lambda f: f.condition(job, "Failed", "DeadlineExceeded"))
    job, out = _start(repo_root, shared, Seen(), "training.max_restarts=1", "launcher.kubernetes.active_deadline_s=60")
    with pytest.raises(PreemptedError) as err:
        job.finish()
    first, again = (b["metadata"]["name"] for m, p, _, b in fake.requests if m == "POST" and p.endswith("/jobs"))
    assert again == f"{first}-r1"
    assert str(err.value) == (f"job ml/{again} ran past its deadline (DeadlineExceeded); no restart left "
                              "(training.max_restarts=1): rerun to resume from its checkpoint")
    assert [(ev["job"], ev["after"]) for ev in read_events(out / LEDGER_FILE)] == [(again, "TIMEOUT")]


def test_the_train_stage_runs_its_plan_on_kubernetes_and_records_the_job_while_it_lives(
        fake, shared, repo_root, mlflow_env, monkeypatch, prefect_api):
    """The pipeline's train task itself (outside a flow): the job is recorded in the home and tagged
    on the MLflow run while it lives, its states go to the task's log, the result comes back."""
    import logging

    from core.manifest import DataRef, ImageRef, Manifest, World
    from flows.pipeline import RunContext, TrainFolder, train
    from registry import store
    from registry.orphans import JOBS_DIR
    from tasks import get_task

    uri = f"sqlite:///{mlflow_env / 'db' / 'mlflow.db'}"
    run_id = store.start_run(store.configure(uri, "trainflow-kube-test", mlflow_env / "artifacts"), "kube", {})
    # The pods' tracking server (rendered only); this process's MLflow client stays on the store above.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.ml.svc:5000")
    plan = _plan(repo_root, shared)
    home = shared / "home"
    manifest = Manifest("0" * 40, False, plan.cfg.name, plan.cfg.config_id(), DataRef("data/digits.dvc", "x.dir", "HEAD"),
                        ImageRef(), "0" * 64, 0, World(2, 1, "gloo"))
    ctx = RunContext(plan.cfg, get_task(plan.cfg.task), repo_root, home, uri, run_id, manifest, tmp := home / "out",
                     plan, launcher="kubernetes")
    tmp.mkdir()
    folder = home / "runs" / "digits-k"
    folder.mkdir(parents=True)
    recorded = []

    def complete(job):
        def step(f):
            recorded.extend(p.name for p in (home / JOBS_DIR).glob("*.json"))
            (folder / "result.json").write_text(json.dumps({"status": "completed", "world_size": 2}))
            f.condition(job, "Complete")
        return step
    _script(fake, running, complete)
    lines = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("flows.pipeline")  # the task's logger outside a flow (Prefect's handlers on it)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        result = train.fn(ctx, TrainFolder(folder, None))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)

    name = _job_name(fake)
    assert result["status"] == "completed" and result["launcher"]["job_id"] == name
    assert recorded == [f"kubernetes-job.ml.{name}.json"] and not list((home / JOBS_DIR).glob("*.json"))
    assert store.client().get_run(run_id).data.tags["trainflow.kubernetes.job_id"] == f"job.ml.{name}"
    assert f"kubernetes: {name}: RUNNING on gpu-a, gpu-b" in lines and f"[{name}] rank 0: epoch 1 loss 0.91" in lines
