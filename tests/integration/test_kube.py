"""The Kubernetes launcher's calls through the official ``kubernetes`` client against a FAKE API server:
no cluster can run here. The fake (stdlib http.server on 127.0.0.1, a thread) implements the few
endpoints the launcher calls (create Job / Service / NetworkPolicy / TrainJob, read a job, list pods
by label, read a pod's log, delete) and moves each job through a scripted series of states, one step
each time the launcher reads the job. What a real cluster does between those reads (scheduling, the
kubelet, the Job controller) is the script's, so these tests show the launcher's side only."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

import jsonschema
import kubernetes_validate

from core.config import load_config
from training import kube
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.integration
# What the API server's strconv.ParseBool takes as true (the client sends Python's "True").
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
REPO = "https://git.example/ml/trainflow.git"
TRAINJOB_SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "trainjob-v1alpha1.json").read_text())
IMAGE = "registry.example:5000/ml/trainflow@sha256:" + "ab" * 32


class FakeKube:
    """Objects by API path; ``scripts[job name]``: steps applied one per read of that job."""

    def __init__(self):
        self.objects: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict, dict | None]] = []  # method, path, query, body
        self.scripts: dict[str, list] = {}
        self.logs: dict[str, list[str]] = {}
        self.ticks = 0
        self.faults: list[tuple[str, str, int, str]] = []  # (method, path ending, code, message), each used once
        self.lock = threading.Lock()

    # --- what a script step uses ---
    def job_path(self, name: str, flavour: str = "job") -> str:
        if flavour == "job":
            return f"/apis/batch/v1/namespaces/ml/jobs/{name}"
        return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/{name}"

    def pod(self, job: str, index: int, phase: str, node: str = "", flavour: str = "job", **status) -> None:
        name = f"{job}-{index}-abcde"
        label = kube.JOB_LABEL[flavour]
        self.objects[f"/api/v1/namespaces/ml/pods/{name}"] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "labels": {label: job},
                         "annotations": {kube.INDEX_KEY: str(index)}},
            "spec": {"nodeName": node or None, "containers": [{"name": kube.CONTAINER[flavour], "image": IMAGE}]},
            "status": {"phase": phase, **status}}

    def log(self, pod: str, *lines: str) -> None:
        for line in lines:
            self.ticks += 1
            stamp = f"2026-12-05T23:00:{self.ticks // 10:02d}.{self.ticks % 10}Z"  # trimmed fraction, as kubelets write
            self.logs.setdefault(pod, []).append(f"{stamp} {line}")

    def condition(self, job: str, kind: str, reason: str = "", flavour: str = "job") -> None:
        obj = self.objects[self.job_path(job, flavour)]
        obj.setdefault("status", {}).setdefault("conditions", []).append(
            {"type": kind, "status": "True", "reason": reason, "message": reason,
             "lastTransitionTime": "2026-12-05T23:01:00Z"})

    # --- the HTTP side ---
    def handle(self, method: str, url: str, body: dict | None) -> tuple[int, object]:
        parsed = urlparse(url)
        path, query = parsed.path, {k: v[0] for k, v in parse_qs(parsed.query).items()}
        with self.lock:
            self.requests.append((method, path, query, body))
            fault = next((f for f in self.faults if f[0] == method and path.endswith(f[1])), None)
            if fault:
                self.faults.remove(fault)
                return fault[2], _status(fault[2], fault[3])
            if method == "POST":
                if "/namespaces/nosuch/" in path:
                    return 404, _status(404, 'namespaces "nosuch" not found')
                name = body["metadata"]["name"]
                obj = {**body, "metadata": {**body["metadata"], "uid": str(uuid.uuid4())}}
                self.objects[f"{path}/{name}"] = obj
                return 201, obj
            if method == "DELETE":
                if self.objects.pop(path, None) is None:
                    return 404, _status(404, "not found")
                return 200, _status(200, "deleted")
            if path.endswith("/log"):
                pod = path.split("/")[-2]
                lines = self.logs.get(pod, [])
                if "tailLines" in query:
                    lines = lines[-int(query["tailLines"]):]
                if query.get("timestamps") not in GO_TRUE:
                    lines = [line.partition(" ")[2] for line in lines]
                return 200, "".join(f"{line}\n" for line in lines)
            if path == "/api/v1/namespaces/ml/pods":
                key, _, value = query.get("labelSelector", "").partition("=")
                items = [o for p, o in self.objects.items() if p.startswith(path + "/")
                         and o["metadata"]["labels"].get(key) == value]
                return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
            name = path.rsplit("/", 1)[-1]
            if path.endswith(f"/jobs/{name}") or path.endswith(f"/trainjobs/{name}"):
                steps = self.scripts.get(name, [])
                if steps and path in self.objects:
                    steps.pop(0)(self)
            if path in self.objects:
                return 200, self.objects[path]
            return 404, _status(404, f"{name} not found")


def _status(code: int, message: str) -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure" if code >= 400 else "Success",
            "message": message, "code": code}


@pytest.fixture
def fake():
    state = FakeKube()

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, method: str) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(size)) if size else None
            code, payload = state.handle(method, self.path, body)
            text = payload if isinstance(payload, str) else json.dumps(payload)
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._reply("GET")

        def do_POST(self):
            self._reply("POST")

        def do_DELETE(self):
            self._reply("DELETE")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    state.client = kube.Kube.connect(state.url)
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


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


def _running(job: str, flavour: str = "job"):
    def step(f: FakeKube):
        for i, node in enumerate(("gpu-a", "gpu-b")):
            f.pod(job, i, "Running", node, flavour)
        f.log(f"{job}-0-abcde", "rank 0: epoch 1 loss 0.91")
    return step


def _terminated(code: int, reason: str = "") -> dict:
    return {"containerStatuses": [{"name": "trainer", "image": IMAGE, "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": {
                                       "exitCode": code, "reason": reason, "finishedAt": "2026-12-05T23:02:00Z"}}}]}


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
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "me", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me", "namespace": "ml"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used
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
