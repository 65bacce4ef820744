"""The Kubernetes launcher's calls through the official ``kubernetes`` client against a FAKE API server:
no cluster can run here. The fake (stdlib http.server on 127.0.0.1, a thread) implements the few
endpoints the launcher calls (create Job / Service / NetworkPolicy / TrainJob, read a job, list pods
by label, read a pod's log, delete) and moves each job through a scripted series of states, one step
each time the launcher reads the job. What a real cluster does between those reads (scheduling, the
kubelet, the Job controller) is the script's, so these tests show the launcher's side only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import jsonschema
import kubernetes_validate

from core.config import load_config
from tests.fake_kube import GO_TRUE, IMAGE, FakeKube, serve, use_kubeconfig
from tests.fake_kube import running as _running
from tests.fake_kube import terminated as _terminated
from training import kube
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.integration
REPO = "https://git.example/ml/trainflow.git"
TRAINJOB_SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "trainjob-v1alpha1.json").read_text())


@pytest.fixture
def fake():
    with serve() as state:
        yield state


@pytest.fixture
def plan(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))

    def make(*overrides: str):
        cfg = load_config(repo_root / "configs" / "digits.yaml",
                          ["training.cpu_workers=1", f"launcher.kubernetes.image={IMAGE}",
                           "launcher.kubernetes.git_repo=https://git.example/ml/trainflow.git",
                           "launcher.kubernetes.namespace=ml", *overrides])
        return plan_launch(cfg, HostFacts(), nproc=1, nnodes=2)
    return make


RENDER = dict(git_ref="0123abcd", data_md5="md5", mlflow_uri="http://mlflow.ml.svc:5000")


def _follow(fake, handle):
    events = list(kube.follow(handle, fake.client, poll_s=0, sleep=lambda s: None))
    return events, events[-1].ending


def test_a_job_is_created_followed_with_pod_zeros_log_and_ends_completed(fake, plan):
    job = "digits-ddp"
    fake.scripts[job] = [
        lambda f: [f.pod(job, i, "Pending", reason="") for i in range(2)],
        _running(job),
        lambda f: f.log(f"{job}-0-abcde", "rank 0: epoch 2 loss 0.52", "rank 0: saved checkpoint step 20"),
        lambda f: (f.pod(job, 0, "Succeeded", "gpu-a", **_terminated(0)), f.pod(job, 1, "Succeeded", "gpu-b", **_terminated(0)),
                   f.condition(job, "Complete")),
    ]
    handle = kube.submit(kube.dry_run(plan(), name=job, **RENDER), fake.client)
    events, ending = _follow(fake, handle)

    posts = [(p, b) for m, p, _, b in fake.requests if m == "POST"]
    assert [p.rsplit("/", 1)[-1] for p, _ in posts] == ["jobs", "networkpolicies", "services"]
    uid = fake.objects[fake.job_path(job)]["metadata"]["uid"]
    for _, body in posts[1:]:  # owned by the Job: deleted with it
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "blockOwnerDeletion": True}]
    assert ending.state == "COMPLETED" and not ending.resume
    assert ending.nodes == ("gpu-a", "gpu-b")
    logs = [e.text for e in events if e.kind == "log"]
    assert logs == ["rank 0: epoch 1 loss 0.91", "rank 0: epoch 2 loss 0.52", "rank 0: saved checkpoint step 20"]
    states = [e.text for e in events if e.kind == "state"]
    assert states[0].startswith(f"{job}: PENDING") and f"{job}: RUNNING on gpu-a, gpu-b" in states
    # Logs are read from where the last read left off: later reads ask only for a recent window.
    log_reads = [q for m, p, q, _ in fake.requests if p.endswith("/log")]
    assert log_reads[0].get("timestamps") in GO_TRUE and "sinceSeconds" in log_reads[-1]


def test_a_failing_pod_is_named_with_its_rank_and_log_tail(fake, plan):
    job = "digits-ddp"
    trace = ["Traceback (most recent call last):", '  File "training/worker.py", line 88, in main',
             "ValueError: dataset.label 'digit' has NaN in row 17"]

    def fail(f: FakeKube):
        f.pod(job, 1, "Failed", "gpu-b", **_terminated(1, "Error"))
        f.log(f"{job}-1-abcde", *trace)
        f.condition(job, "Failed", "PodFailurePolicy")
    fake.scripts[job] = [_running(job), fail]
    handle = kube.submit(kube.dry_run(plan(), name=job, **RENDER), fake.client)
    events, ending = _follow(fake, handle)

    assert ending.state == "FAILED" and not ending.resume
    assert ending.pod == f"{job}-1-abcde" and ending.rank == 1
    assert ending.log_tail.splitlines() == trace
    assert ending.message == (f"job ml/{job} failed: pod {job}-1-abcde (node rank 1, on gpu-b) exited 1 (Error): "
                              "ValueError: dataset.label 'digit' has NaN in row 17")
    assert f"pod {job}-1-abcde (node rank 1) failed: exit code 1 (Error)" in [e.text for e in events if e.kind == "error"]
    tail_reads = [q for m, p, q, _ in fake.requests if p.endswith(f"{job}-1-abcde/log")]
    assert tail_reads == [{"container": "trainer", "tailLines": str(kube.LOG_TAIL_LINES)}]


def test_an_interrupted_run_deletes_its_job_with_foreground_propagation(fake, plan):
    job = "digits-ddp"
    fake.scripts[job] = [_running(job)]

    def on_event(event):
        if event.kind == "state" and "RUNNING" in event.text:
            raise KeyboardInterrupt  # Ctrl-C, or a Prefect cancellation, while the job runs

    with pytest.raises(KeyboardInterrupt):
        kube.run(plan(), fake.client, name=job, on_event=on_event, poll_s=0, sleep=lambda s: None, **RENDER)
    deletes = [(p, b) for m, p, _, b in fake.requests if m == "DELETE"]
    assert deletes == [(fake.job_path(job), {"propagationPolicy": "Foreground"})]
    assert fake.job_path(job) not in fake.objects
    assert kube.cancel(kube.Handle(job, "ml", "job"), fake.client) is False  # already gone: nothing to do


def test_an_evicted_pod_resumes_in_a_new_job_in_the_same_folder(fake, plan):
    first, again = "digits-ddp", "digits-ddp-r1"

    def evicted(f: FakeKube):
        f.pod(first, 0, "Failed", "gpu-a", reason="Evicted", message="The node was low on resource: memory.")
        f.condition(first, "Failed", "BackoffLimitExceeded")
    fake.scripts[first] = [_running(first), evicted]
    fake.scripts[again] = [_running(again), lambda f: f.condition(again, "Complete")]
    events = []
    ending, names = kube.run(plan("training.max_restarts=1"), fake.client, name=first, on_event=events.append,
                             poll_s=0, sleep=lambda s: None, **RENDER)

    assert names == [first, again] and ending.state == "COMPLETED"
    preempted = next(e.ending for e in events if e.ending and e.ending.state == "PREEMPTED")
    assert preempted.resume and preempted.pod == f"{first}-0-abcde" and preempted.rank == 0
    assert "(Evicted); resuming from the last checkpoint" in preempted.message
    # The second job trains into the first one's folder, where the checkpoints are.
    for name in names:
        args = fake.objects[fake.job_path(name)]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[args.index("--out") + 1] == f"/shared/{first}"


def test_resumes_stop_at_max_restarts(fake, plan):
    job = "digits-ddp"

    def deadline(f: FakeKube):
        f.condition(job, "Failed", "DeadlineExceeded")
    fake.scripts[job] = [_running(job), deadline]
    ending, names = kube.run(plan("training.max_restarts=0", "launcher.kubernetes.active_deadline_s=60"),
                             fake.client, name=job, on_event=lambda e: None, poll_s=0, sleep=lambda s: None, **RENDER)
    assert names == [job] and ending.state == "TIMEOUT" and "DeadlineExceeded" in ending.message


def test_a_job_deleted_by_someone_else_ends_cancelled_in_one_line(fake, plan):
    job = "digits-ddp"
    fake.scripts[job] = [_running(job), lambda f: f.objects.pop(f.job_path(job))]
    handle = kube.submit(kube.dry_run(plan(), name=job, **RENDER), fake.client)
    _, ending = _follow(fake, handle)
    assert ending.state == "CANCELLED" and ending.message == (
        f"job ml/{job} was deleted by someone else; training stopped")


def test_a_trainjob_is_created_as_a_custom_object_and_followed(fake, plan):
    job = "digits-ddp"
    fake.scripts[job] = [_running(job, "trainjob"), lambda f: f.condition(job, "Complete", flavour="trainjob")]
    handle = kube.submit(kube.dry_run(plan("launcher.kubernetes.flavour=trainjob"), name=job, **RENDER), fake.client)
    events, ending = _follow(fake, handle)
    posts = [p for m, p, _, _ in fake.requests if m == "POST"]
    assert posts == ["/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs",
                     "/apis/networking.k8s.io/v1/namespaces/ml/networkpolicies"]
    assert ending.state == "COMPLETED"
    assert [e.text for e in events if e.kind == "log"] == ["rank 0: epoch 1 loss 0.91"]
    pods = [q for m, p, q, _ in fake.requests if p == "/api/v1/namespaces/ml/pods"]
    assert pods[0]["labelSelector"] == f"jobset.sigs.k8s.io/jobset-name={job}"


def test_a_refused_request_comes_back_as_the_apis_one_line(fake, plan):
    with pytest.raises(kube.KubeError) as err:
        kube.submit(kube.dry_run(plan("launcher.kubernetes.namespace=nosuch"), name="digits-ddp", **RENDER),
                    fake.client)
    assert str(err.value) == 'kubernetes: creating job nosuch/digits-ddp: namespaces "nosuch" not found'


def _kubeconfig(fake, tmp_path, monkeypatch) -> None:
    use_kubeconfig(fake, tmp_path, monkeypatch)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))


def _launch(repo_root, *extra: str) -> int:
    from flows.cli import main

    return main(["k8s-launch", "--config", str(repo_root / "configs" / "digits.yaml"), "--nnodes", "2", "--nproc", "1",
                 "--git-ref", "0123abcd", "--mlflow-uri", "http://mlflow.ml.svc:5000", "--submit",
                 "--set", f"launcher.kubernetes.image={IMAGE}", "--set", "launcher.kubernetes.namespace=ml",
                 "--set", f"launcher.kubernetes.git_repo={REPO}", "--set", "launcher.kubernetes.poll_s=0.01", *extra])


def test_the_cli_submits_through_the_kubeconfig_and_exits_with_the_ending(fake, repo_root, tmp_path, monkeypatch, capsys):
    _kubeconfig(fake, tmp_path, monkeypatch)
    job = "trainflow-digits"

    def fail(f: FakeKube):
        f.pod(job, 0, "Failed", "gpu-a", **_terminated(1, "Error"))
        f.log(f"{job}-0-abcde", "RuntimeError: CUDA error: out of memory")
        f.condition(job, "Failed", "PodFailurePolicy")
    fake.scripts[job] = [_running(job), fail]
    code = _launch(repo_root)
    out, err = capsys.readouterr()
    assert code == 1, err
    assert out, err
    summary = json.loads(out)
    assert summary["state"] == "FAILED" and summary["pod"] == f"{job}-0-abcde" and summary["rank"] == 0
    assert summary["message"].endswith("RuntimeError: CUDA error: out of memory")
    assert "trainflow: k8s: rank 0: epoch 1 loss 0.91" in err.splitlines()


def test_sigterm_to_the_cli_deletes_its_job(fake, repo_root, tmp_path, monkeypatch, capsys):
    import os
    import signal

    _kubeconfig(fake, tmp_path, monkeypatch)
    job = "trainflow-digits"
    # SIGTERM arrives while the job runs (the step runs in the server's thread; Python handles it in the main one).
    fake.scripts[job] = [_running(job), lambda f: os.kill(os.getpid(), signal.SIGTERM)]
    before = signal.getsignal(signal.SIGTERM)
    code = _launch(repo_root)
    assert code == 1
    assert capsys.readouterr().err.splitlines()[-1] == "trainflow: error: k8s-launch: interrupted; the job was deleted"
    assert [(p, b) for m, p, _, b in fake.requests if m == "DELETE"] == [
        (fake.job_path(job), {"propagationPolicy": "Foreground"})]
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(("flavour", "kinds"), [("job", ["Job", "NetworkPolicy", "Service"]),
                                                ("trainjob", ["TrainJob", "NetworkPolicy"])])
def test_the_cli_prints_the_plans_manifests(repo_root, tmp_path, monkeypatch, capsys, flavour, kinds):
    import yaml

    from flows.cli import main

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    code = main(["k8s-launch", "--config", str(repo_root / "configs" / "digits.yaml"), "--nnodes", "2", "--nproc", "2",
                 "--git-ref", "0123abcd", "--mlflow-uri", "http://mlflow.ml.svc:5000",
                 "--set", f"launcher.kubernetes.image={IMAGE}", "--set", f"launcher.kubernetes.git_repo={REPO}",
                 "--set", f"launcher.kubernetes.flavour={flavour}"])
    assert code == 0
    manifests = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [m["kind"] for m in manifests] == kinds
    assert manifests[0]["metadata"]["name"] == "trainflow-digits"
    for m in manifests:
        if m["kind"] == "TrainJob":
            jsonschema.validate(m, TRAINJOB_SCHEMA)
        else:
            kubernetes_validate.validate(m, kubernetes_validate.latest_version(), strict=True)


def test_following_rides_out_an_api_server_that_does_not_answer_for_a_while(fake, plan):
    job = "digits-ddp"
    fake.scripts[job] = [_running(job), lambda f: f.condition(job, "Complete")]
    fake.faults = [("GET", f"/jobs/{job}", 503, "etcdserver: leader changed")] * 2
    handle = kube.submit(kube.dry_run(plan(), name=job, **RENDER), fake.client)
    events, ending = _follow(fake, handle)
    assert ending.state == "COMPLETED"
    retries = [e.text for e in events if "asking again" in e.text]
    assert retries == [f"{job}: kubernetes: reading job ml/{job}: etcdserver: leader changed; asking again "
                       f"({n} of {kube.API_RETRIES})" for n in (1, 2)]


def test_following_gives_up_when_the_api_keeps_failing_and_run_still_deletes_the_job(fake, plan):
    job = "digits-ddp"
    fake.faults = [("GET", f"/jobs/{job}", 500, "internal error")] * (kube.API_RETRIES + 1)
    with pytest.raises(kube.KubeError, match="internal error"):
        kube.run(plan(), fake.client, name=job, on_event=lambda e: None, poll_s=0, sleep=lambda s: None, **RENDER)
    assert [(m, p) for m, p, _, _ in fake.requests if m == "DELETE"] == [("DELETE", fake.job_path(job))]


def test_a_job_whose_service_is_refused_is_deleted_at_once(fake, plan):
    fake.faults = [("POST", "/services", 403, 'services "digits-ddp" is forbidden: exceeded quota')]
    with pytest.raises(kube.KubeError) as err:
        kube.submit(kube.dry_run(plan(), name="digits-ddp", **RENDER), fake.client)
    assert str(err.value) == ('kubernetes: creating Service ml/digits-ddp: services "digits-ddp" is forbidden: '
                              "exceeded quota")
    assert [p for m, p, _, _ in fake.requests if m == "DELETE"] == [fake.job_path("digits-ddp")]


def test_a_job_pending_past_its_limit_is_deleted_and_says_why(fake, plan):
    job = "digits-ddp"
    unschedulable = {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
    fake.scripts[job] = [lambda f: [f.pod(job, i, "Pending", **unschedulable) for i in range(2)]]
    handle = kube.submit(kube.dry_run(plan(), name=job, **RENDER), fake.client)
    now = iter(range(0, 10_000, 30))  # each look at the clock is 30 s later: no waiting in the test
    events = list(kube.follow(handle, fake.client, poll_s=0, pending_timeout_s=60, sleep=lambda s: None,
                              clock=lambda: next(now)))
    ending = events[-1].ending
    assert ending.state == "FAILED"
    assert ending.message == f"{job}: still pending after 60 s (Unschedulable); the job was deleted"
    assert [b for m, p, _, b in fake.requests if m == "DELETE"] == [{"propagationPolicy": "Foreground"}]
