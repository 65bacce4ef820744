"""A FAKE Kubernetes API server for tests: no cluster can run here. The fake (stdlib http.server on
127.0.0.1, a thread) implements the few endpoints the launcher calls (create Job / Service /
NetworkPolicy / TrainJob, read a job, list pods by label, read a pod's log, delete) and moves each
job through a scripted series of states, one step each time the launcher reads the job. What a real
cluster does between those reads (scheduling, the kubelet, the Job controller) is the script's, so
tests against it show the launcher's side only."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from training import kube

# What the API server's strconv.ParseBool takes as true (the client sends Python's "True").
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
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


@contextlib.contextmanager
def serve() -> Iterator[FakeKube]:
    """A FakeKube behind an HTTP server on 127.0.0.1 (a thread); ``.url`` and ``.client`` (a kube.Kube)."""
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
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def running(job: str, flavour: str = "job"):
    def step(f: FakeKube):
        for i, node in enumerate(("gpu-a", "gpu-b")):
            f.pod(job, i, "Running", node, flavour)
        f.log(f"{job}-0-abcde", "rank 0: epoch 1 loss 0.91")
    return step


def terminated(code: int, reason: str = "") -> dict:
    return {"containerStatuses": [{"name": "trainer", "image": IMAGE, "imageID": "", "ready": False,
                                   "restartCount": 0, "state": {"terminated": {
                                       "exitCode": code, "reason": reason, "finishedAt": "2026-12-05T23:02:00Z"}}}]}


def use_kubeconfig(fake: FakeKube, folder, monkeypatch) -> None:
    """$KUBECONFIG names ``fake`` (namespace ml), as on a host outside the cluster."""
    path = folder / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": fake.url}}],
        "users": [{"name": "me", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me", "namespace": "ml"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod: the kubeconfig is used
