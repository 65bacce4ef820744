"""The Kubernetes launcher: a launch plan (``training.plan``) as an indexed Job or a Kubeflow Trainer v2
TrainJob, in TorchX's four verbs, through the official ``kubernetes`` client.

- ``dry_run``: pure; renders the manifests from the plan and the config's ``launcher.kubernetes``
  section (an indexed Job + headless Service for the c10d rendezvous, or a TrainJob on the cluster's
  training runtime), each behind a NetworkPolicy that admits only the job's own pods.
- ``submit``: creates them; the Job first, then what it owns (deleted with it).
- ``describe``: the job's and its pods' status mapped onto ``STATES``; ``follow`` yields that as
  events (state changes, pod 0's log lines, failing pods' errors) and ends with an ``Ending``.
- ``cancel``: deletes the job with Foreground propagation (its pods go first).

``run`` strings them together: a preempted, evicted or out-of-time job is submitted again (up to
``training.max_restarts``) and its workers resume from the checkpoints in the shared folder.

Each pod clones the run's commit, pulls its data version with DVC and runs the torchrun agent that
the local launcher runs (``JobSpec.command``), with the plan's config from an environment variable.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from core.env import TELEMETRY_OFF
from core.errors import ConfigError, PreemptedError, TrainflowError
from training.launcher import job_env, plan_spec
from training.plan import LaunchPlan

RDZV_PORT = 29400
# Kubeflow Trainer v2's TrainJob (trainer.kubeflow.org/v1alpha1, Trainer v2.0-v2.3).
TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
# Which pods belong to a job, and which one each is (the completion index is the node rank).
JOB_LABEL = {"job": "trainflow/job", "trainjob": "jobset.sigs.k8s.io/jobset-name"}
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
# The training container: ours in a Job; Trainer's torch runtime names it "node".
CONTAINER = {"job": "trainer", "trainjob": "node"}
STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "PREEMPTED", "TIMEOUT", "CANCELLED")
# Endings the next job resumes from the checkpoint.
RESUME = frozenset({"PREEMPTED", "TIMEOUT"})
LOG_TAIL_LINES = 20
# Polls in a row the API may fail to answer while a job is followed before following gives up.
API_RETRIES = 5
# Pod statuses that say the node or the cluster took the pod away (not the code failing).
_TAKEN = frozenset({"Evicted", "Preempting", "Shutdown", "NodeShutdown", "Terminated", "NodeLost", "DeadlineExceeded"})
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,50}[a-z0-9])?$")

# One shell line per pod: fetch the code and the data version, write the plan's config, then become
# the torchrun agent ("$@": JobSpec.command).
NODE_SCRIPT = (
    'set -eu; mkdir -p "$TRAINFLOW_WORKDIR"; cd "$TRAINFLOW_WORKDIR"; '
    'printf "%s\\n" "$TRAINFLOW_CONFIG" > config.yaml; '
    'git clone --quiet "$TRAINFLOW_GIT_REPO" src; cd src; git checkout --quiet "$TRAINFLOW_GIT_REF"; dvc pull -q; '
    'exec "$@"'
)


class KubeError(TrainflowError):
    """The Kubernetes API refused a request; the message is its own reason, in one line. ``transient``:
    it did not answer (unreachable, 5xx, throttled), so the same request may work later."""

    transient = False


@dataclass(frozen=True)
class Handle:
    name: str
    namespace: str
    flavour: str  # "job" | "trainjob"


@dataclass(frozen=True)
class KubeRequest(Handle):
    """What ``submit`` creates: ``manifests`` in order, the job (Job or TrainJob) first."""

    manifests: list[dict]
    out_dir: str  # the training folder on the shared volume, the same for every resubmission


@dataclass(frozen=True)
class PodState:
    name: str
    rank: int | None  # the completion index: the node rank
    phase: str
    node: str = ""
    reason: str = ""  # why pending, why it failed (Evicted, OOMKilled, ImagePullBackOff, ...)
    exit_code: int | None = None
    taken: bool = False  # evicted / preempted / its node shut down: not the code's failure
    finished_at: str = ""


@dataclass(frozen=True)
class Status:
    state: str  # one of STATES
    reason: str = ""
    pods: tuple[PodState, ...] = ()


@dataclass(frozen=True)
class Ending:
    """How a job ended: ``state`` one of COMPLETED, FAILED, PREEMPTED, TIMEOUT, CANCELLED; ``message``
    one line; for FAILED the failing ``pod``, its ``rank`` and its last log lines."""

    state: str
    message: str
    pod: str = ""
    rank: int | None = None
    log_tail: str = ""
    nodes: tuple[str, ...] = ()

    @property
    def resume(self) -> bool:
        return self.state in RESUME


@dataclass(frozen=True)
class Event:
    kind: str  # "state" | "log" | "error" | "ending"
    text: str
    ending: Ending | None = None


# --- rendering (pure) ---------------------------------------------------------------------------

def pin_image(image: str, digest: str | None = None) -> tuple[str, str, str]:
    """(the ref pods run: REPO@sha256:..., the ref to record, the digest); a ref without a digest is
    refused: a tag can move between the pods' pulls."""
    if "@" in image:
        repo, _, in_ref = image.partition("@")
        if digest and digest != in_ref:
            raise ValueError(f"image {image} carries digest {in_ref}, but image_digest is {digest}")
        digest = in_ref
    else:
        repo = image
        if not digest:
            raise ValueError(f"image {image}: multi-node pods must run one exact image; give REPO@sha256:... "
                             "or an image digest (a tag can move between pods' pulls)")
    if not _DIGEST.match(digest):
        raise ValueError(f"image digest {digest!r}: expected sha256:<64 hex>")
    name = repo.rsplit("/", 1)[-1]
    base = repo[: -len(name)] + name.split(":", 1)[0] if ":" in name else repo
    return f"{base}@{digest}", image, digest


def network_policy(name: str, namespace: str, labels: dict, selector: dict) -> dict:
    """Only the job's own pods may connect to its pods (the c10d store, whose values agents unpickle,
    and the collectives on ephemeral ports): peers get every port, nobody else any."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": dict(selector)}}]}]}}


def headless_service(name: str, namespace: str, labels: dict, selector: dict) -> dict:
    """DNS ``<job>-<i>.<job>`` for each indexed pod, so every agent finds pod 0's c10d store."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)}, "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,  # the rendezvous happens before any pod is "ready"
                "selector": dict(selector),
                "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}]}}


def resources(gpus: int, cpu: str = "8", memory: str = "64Gi") -> dict:
    limits = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
    return {"limits": limits, "requests": dict(limits)}


def trainer_pod(name: str, image: str, args: list[str], env: list[dict], gpus: int, shared_pvc: str,
                mlflow_secret: str | None = None, service_account: str | None = None, cpu: str = "8",
                memory: str = "64Gi") -> dict:
    """The pod spec of one torchrun agent of an indexed Job: the shared volume at /shared, a scratch
    /workspace, /dev/shm in memory."""
    pod = {
        "subdomain": name,
        "restartPolicy": "Never",
        "containers": [{
            "name": CONTAINER["job"],
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            # Args only: the image's entrypoint (tini) stays, so SIGTERM reaches the agent
            # (preemption: checkpoint, exit 4).
            "args": args,
            "env": env,
            # Credentials from a Secret, never rendered into the manifest.
            **({"envFrom": [{"secretRef": {"name": mlflow_secret}}]} if mlflow_secret else {}),
            "ports": [{"name": "c10d", "containerPort": RDZV_PORT, "protocol": "TCP"}],
            "resources": resources(gpus, cpu, memory),
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"},
                             {"name": "workspace", "mountPath": "/workspace"},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": shared_pvc}},
            {"name": "workspace", "emptyDir": {}},
            # NCCL and DataLoader workers use /dev/shm.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        ],
    }
    if gpus:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if service_account:
        pod["serviceAccountName"] = service_account
    return pod


def indexed_job(name: str, namespace: str, labels: dict, nnodes: int, pod_spec: dict,
                active_deadline_s: int | None = None) -> dict:
    """``nnodes`` pods at once, numbered by completion index; torchrun restarts workers inside a pod."""
    spec = {
        "completionMode": "Indexed",
        "completions": nnodes,
        "parallelism": nnodes,  # all agents at once: the rendezvous waits for nnodes
        "backoffLimit": 0,  # torchrun restarts workers inside a pod (training.max_restarts)
        # A node taken away (eviction, preemption) or a preempted agent (exit 4: it checkpointed)
        # does not count as a failure: the pod is recreated and training resumes from /shared.
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER["job"], "operator": "In",
                                                 "values": [PreemptedError.exit_code]}},
        ]},
        "ttlSecondsAfterFinished": 7 * 24 * 3600,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    if active_deadline_s:
        spec["activeDeadlineSeconds"] = active_deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)}, "spec": spec}


def dry_run(plan: LaunchPlan, *, name: str, git_ref: str, data_md5: str, mlflow_uri: str,
            mlflow_run_id: str | None = None, rdzv_id: str | None = None, out_name: str | None = None,
            env: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> KubeRequest:
    """The manifests that run ``plan`` with the config's ``launcher.kubernetes`` settings; reads and
    writes nothing. ``name``: the job's (a DNS label); ``out_name``: the training folder under /shared
    (default ``name``; a resubmission keeps the first job's, so it resumes there); ``rdzv_id``: drawn
    at random by default (agents unpickle what the c10d store holds under it); ``env``: variables the
    workers get beside the plan's; ``labels``: more labels on every object (e.g. the run's ids).
    ConfigError naming the key when the settings don't fit."""
    k = plan.cfg.launcher.kubernetes
    if not _NAME.match(name):
        raise ConfigError(f"kubernetes job name {name!r}: a DNS label of lowercase letters, digits and '-' "
                          "(at most 52 chars, starting with a letter)")
    if not k.image:
        raise ConfigError("launcher.kubernetes.image: required (REPO@sha256:...), the image every pod runs")
    if not k.git_repo:
        raise ConfigError("launcher.kubernetes.git_repo: required, the repository every pod clones")
    if not git_ref:
        raise ConfigError("kubernetes: the run's git commit is required: every pod checks out the same one")
    if not mlflow_uri.startswith(("http://", "https://")):
        raise ConfigError(f"kubernetes: MLflow at {mlflow_uri!r}: pods need a tracking server (http[s]://...); "
                          "nodes cannot share a sqlite file")
    pinned, ref, digest = pin_image(k.image)
    lo, hi = plan.node_range
    if lo != hi:
        raise ConfigError(f"--nnodes {plan.nnodes}: the kubernetes launcher runs a fixed number of pods; give N")
    trainjob = k.flavour == "trainjob"
    workdir = "/tmp/trainflow" if trainjob else "/workspace"
    if trainjob:  # Trainer's torch runtime tells each node where rank 0's node is and which node it is
        endpoint, rank = "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)", "$(PET_NODE_RANK)"
    else:
        endpoint, rank = f"{name}-0.{name}.{k.namespace}.svc:{RDZV_PORT}", "$(JOB_COMPLETION_INDEX)"
    out_dir = f"/shared/{out_name or name}"
    spec = plan_spec(plan, _Posix(out_dir), _Posix(f"{workdir}/src"), data_md5, rdzv_endpoint=endpoint,
                     rdzv_id=rdzv_id or secrets.token_hex(16))
    # $(VAR) in args is the kubelet's expansion from the container's env: no shell quoting involved.
    command = [f"--node-rank={rank}" if w.startswith("--node-rank=") else w
               for w in spec.command(_Posix(f"{out_dir}/torchrun"))]
    command[0] = "python"
    command[command.index("--config") + 1] = f"{workdir}/config.yaml"
    env = [
        *([] if trainjob else [{"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}}]),
        {"name": "TRAINFLOW_WORKDIR", "value": workdir},
        {"name": "TRAINFLOW_CONFIG", "value": plan.cfg.to_yaml()},
        {"name": "TRAINFLOW_IMAGE", "value": ref},
        {"name": "TRAINFLOW_IMAGE_DIGEST", "value": digest},
        {"name": "TRAINFLOW_GIT_REPO", "value": k.git_repo},
        {"name": "TRAINFLOW_GIT_REF", "value": git_ref},
        {"name": "MLFLOW_TRACKING_URI", "value": mlflow_uri},
        *([{"name": "TRAINFLOW_MLFLOW_RUN_ID", "value": mlflow_run_id}] if mlflow_run_id else []),
        {"name": "TRAINFLOW_HOME", "value": f"{workdir}/state"},
        {"name": "PYTHONPATH", "value": f"{workdir}/src"},
        *({"name": key, "value": value} for key, value in
          sorted({**TELEMETRY_OFF, **job_env(spec), **(env or {})}.items())),
    ]
    args = ["sh", "-c", NODE_SCRIPT, "trainflow-node", *command]
    labels = {"app.kubernetes.io/name": "trainflow", "app.kubernetes.io/component": "train",
              **(labels or {}), "trainflow/job": name}
    selector = {JOB_LABEL[k.flavour]: name}
    policy = network_policy(name, k.namespace, labels, selector)
    if not trainjob:
        pod = trainer_pod(name, pinned, args, env, k.gpus_per_node, k.shared_pvc, k.mlflow_secret,
                          k.service_account, k.cpu, k.memory)
        job = indexed_job(name, k.namespace, labels, hi, pod, k.active_deadline_s)
        return KubeRequest(name, k.namespace, "job", [job, policy, headless_service(name, k.namespace, labels, selector)],
                           out_dir)
    if k.mlflow_secret or k.service_account:
        raise ConfigError("launcher.kubernetes: mlflow_secret and service_account are the training runtime's to set "
                          f"for a TrainJob (ClusterTrainingRuntime {k.runtime}); leave them null with flavour trainjob")
    # Args only, as in the Job: the image's entrypoint stays (the torch runtime sets no command).
    trainer = {"image": pinned, "args": args, "env": env, "numNodes": hi,
               "numProcPerNode": plan.nproc_per_node, "resourcesPerNode": resources(k.gpus_per_node, k.cpu, k.memory)}
    job = {"apiVersion": f"{TRAINJOB_GROUP}/{TRAINJOB_VERSION}", "kind": "TrainJob",
           "metadata": {"name": name, "namespace": k.namespace, "labels": labels},
           "spec": {"runtimeRef": {"name": k.runtime, "apiGroup": TRAINJOB_GROUP, "kind": "ClusterTrainingRuntime"},
                    "trainer": trainer,
                    **({"activeDeadlineSeconds": k.active_deadline_s} if k.active_deadline_s else {})}}
    return KubeRequest(name, k.namespace, "trainjob", [job, policy], out_dir)


class _Posix(str):
    """A path on the pods (not this host): ``plan_spec`` and ``JobSpec.command`` only format it."""

    def __truediv__(self, other: str) -> _Posix:
        return _Posix(f"{self.rstrip('/')}/{other}")


# --- the API ------------------------------------------------------------------------------------

class Kube:
    """The official client's API groups trainflow calls, on one ApiClient."""

    def __init__(self, api_client: Any):
        from kubernetes import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @classmethod
    def connect(cls, host: str | None = None) -> Kube:
        """``host`` (e.g. a test's fake API server), else the pod's service account, else $KUBECONFIG or
        ~/.kube/config."""
        from kubernetes import client, config

        if host:
            return cls(client.ApiClient(client.Configuration(host=host)))
        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                # $KUBECONFIG read now: the client reads it once, when first imported.
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
            except (config.ConfigException, OSError) as exc:
                raise KubeError(f"kubernetes: no cluster to talk to: not in a pod, and no kubeconfig ({exc})") from None
        return cls(client.ApiClient())

    def plain(self, obj: Any) -> dict:
        return obj if isinstance(obj, dict) else self.api_client.sanitize_for_serialization(obj)


def _api_error(exc: Exception, doing: str) -> KubeError:
    """The client's ApiException, or urllib3's error when the server did not answer, as one line."""
    body = getattr(exc, "body", None) or ""
    try:
        message = json.loads(body).get("message", "")
    except (ValueError, AttributeError):
        message = ""
    status = getattr(exc, "status", None)
    reason = message or getattr(exc, "reason", "") or str(exc)
    if status is None:
        reason = f"cannot reach the API server ({type(exc).__name__}: {reason})"
    error = KubeError(f"kubernetes: {doing}: {' '.join(str(reason).split())}")
    error.transient = status is None or status == 429 or status >= 500
    return error


def _errors() -> tuple[type[Exception], ...]:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    return ApiException, HTTPError


def submit(request: KubeRequest, kube: Kube) -> Handle:
    """Create the job, then the objects it owns (garbage-collected with it); KubeError with the API's
    reason when it refuses (a missing namespace, a quota, an unknown TrainingRuntime)."""
    job, *owned = request.manifests
    ns, handle = request.namespace, Handle(request.name, request.namespace, request.flavour)
    try:
        if request.flavour == "job":
            created = kube.plain(kube.batch.create_namespaced_job(ns, job))
        else:
            created = kube.custom.create_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, ns,
                                                                  TRAINJOB_PLURAL, job)
    except _errors() as exc:
        raise _api_error(exc, f"creating {request.flavour} {ns}/{request.name}") from None
    owner = {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": request.name,
             "uid": created["metadata"]["uid"], "blockOwnerDeletion": True}
    for manifest in owned:
        body = {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [owner]}}
        try:
            if manifest["kind"] == "Service":
                kube.core.create_namespaced_service(ns, body)
            else:
                kube.net.create_namespaced_network_policy(ns, body)
        except _errors() as exc:
            # Without its Service the pods cannot meet, without its policy they are open: no job at all.
            error = _api_error(exc, f"creating {manifest['kind']} {ns}/{request.name}")
            cancel(handle, kube)
            raise error from None
    return handle


def cancel(handle: Handle, kube: Kube) -> bool:
    """Delete the job, its pods first (Foreground propagation); False when it was already gone."""
    from kubernetes import client

    body = client.V1DeleteOptions(propagation_policy="Foreground")
    try:
        if handle.flavour == "job":
            kube.batch.delete_namespaced_job(handle.name, handle.namespace, body=body)
        else:
            kube.custom.delete_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, handle.namespace,
                                                        TRAINJOB_PLURAL, handle.name, body=body)
    except _errors() as exc:
        if getattr(exc, "status", None) == 404:
            return False
        raise _api_error(exc, f"deleting {handle.flavour} {handle.namespace}/{handle.name}") from None
    return True


def _pod_state(pod: dict, flavour: str) -> PodState:
    meta, status = pod.get("metadata", {}), pod.get("status", {}) or {}
    index = (meta.get("annotations") or {}).get(INDEX_KEY) or (meta.get("labels") or {}).get(INDEX_KEY)
    reason, exit_code, finished = status.get("reason", ""), None, ""
    for c in status.get("containerStatuses") or []:
        if c.get("name") != CONTAINER[flavour]:
            continue
        state = c.get("state") or {}
        if "terminated" in state:
            term = state["terminated"]
            exit_code, finished = term.get("exitCode"), term.get("finishedAt") or ""
            reason = reason or (term.get("reason", "") if exit_code else "")
        elif "waiting" in state:
            reason = reason or state["waiting"].get("reason", "")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = reason or cond.get("reason", "")
    disrupted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
    taken = disrupted or reason in _TAKEN or exit_code == PreemptedError.exit_code
    return PodState(name=meta.get("name", ""), rank=int(index) if str(index or "").isdigit() else None,
                    phase=status.get("phase", "Pending"), node=(pod.get("spec") or {}).get("nodeName") or "",
                    reason=reason, exit_code=exit_code, taken=taken, finished_at=finished)


def _read_job(handle: Handle, kube: Kube) -> tuple[dict | None, list[dict]]:
    """(the job, its pods); (None, []) once the job is gone."""
    try:
        if handle.flavour == "job":
            job = kube.plain(kube.batch.read_namespaced_job(handle.name, handle.namespace))
        else:
            job = kube.custom.get_namespaced_custom_object(TRAINJOB_GROUP, TRAINJOB_VERSION, handle.namespace,
                                                           TRAINJOB_PLURAL, handle.name)
        return job, kube.plain(kube.core.list_namespaced_pod(
            handle.namespace, label_selector=f"{JOB_LABEL[handle.flavour]}={handle.name}")).get("items", [])
    except _errors() as exc:
        if getattr(exc, "status", None) == 404:
            return None, []
        raise _api_error(exc, f"reading {handle.flavour} {handle.namespace}/{handle.name}") from None


def describe(handle: Handle, kube: Kube) -> Status | None:
    """Where the job is (None once it no longer exists): PENDING until every pod runs (with the first
    pod's reason), RUNNING, or an ending: COMPLETED; TIMEOUT (its deadline); PREEMPTED (a pod was
    evicted, preempted or checkpointed on SIGTERM); FAILED. A suspended job (e.g. queued by Kueue)
    is PENDING."""
    job, listed = _read_job(handle, kube)
    if job is None:
        return None
    # Only the training pods (a TrainJob's initializers carry the same label).
    pods = sorted((_pod_state(p, handle.flavour) for p in listed
                   if any(c.get("name") == CONTAINER[handle.flavour] for c in (p.get("spec") or {}).get("containers") or [])),
                  key=lambda p: (p.rank is None, p.rank or 0, p.name))
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
    if "Complete" in conditions:
        return Status("COMPLETED", conditions["Complete"].get("reason", ""), tuple(pods))
    if "Failed" in conditions:
        reason = conditions["Failed"].get("reason", "") or ""
        if reason == "DeadlineExceeded":
            return Status("TIMEOUT", reason, tuple(pods))
        if any(p.taken for p in pods if p.phase == "Failed") and not any(
                p.exit_code not in (None, 0, PreemptedError.exit_code) and not p.taken for p in pods):
            return Status("PREEMPTED", reason, tuple(pods))
        return Status("FAILED", reason, tuple(pods))
    expected = int((job.get("spec") or {}).get("parallelism") or
                   ((job.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)
    started = [p for p in pods if p.phase in ("Running", "Succeeded")]
    if len(started) >= expected:
        return Status("RUNNING", "", tuple(pods))
    waiting = next((p.reason for p in pods if p.phase == "Pending" and p.reason), "")
    return Status("PENDING", waiting or ("no pods yet" if not pods else ""), tuple(pods))


def _log(kube: Kube, pod: str, handle: Handle, **query) -> str:
    """The training container's log as text (the raw body: the client's own decoding of a log is not
    text in every version)."""
    response = kube.core.read_namespaced_pod_log(pod, handle.namespace, container=CONTAINER[handle.flavour],
                                                 _preload_content=False, **query)
    return response.data.decode("utf-8", "replace")


class _LogCursor:
    """Pod 0's log, read again every poll from where it was left: the API has no offset, so the
    lines carry the kubelet's timestamps and only later ones are new."""

    def __init__(self) -> None:
        self.pod, self.last, self.read_at = "", (), 0.0

    def new_lines(self, handle: Handle, pod: str, kube: Kube) -> list[str]:
        if pod != self.pod:  # a recreated pod 0: its log starts over
            self.pod, self.last, self.read_at = pod, (), 0.0
        kwargs = {"timestamps": True}
        if self.read_at:  # the window since the last read, on the server's clock, with a margin
            kwargs["since_seconds"] = int(time.monotonic() - self.read_at) + 60
        try:
            text = _log(kube, pod, handle, **kwargs)
        except _errors():
            return []  # not started yet, gone, or no answer this time: the next poll reads on from here
        self.read_at = time.monotonic()
        out = []
        for line in text.splitlines():
            stamp, _, rest = line.partition(" ")
            key = _stamp_key(stamp)
            if key > self.last:
                self.last = key
                out.append(rest)
        return out


def _stamp_key(stamp: str) -> tuple:
    """RFC 3339 with up to nine fraction digits, as a sortable key (the kubelet trims trailing zeros)."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return (head, frac.ljust(9, "0"))


def follow(handle: Handle, kube: Kube, poll_s: float = 5.0, pending_timeout_s: float | None = None,
           sleep=time.sleep, clock=time.monotonic) -> Iterator[Event]:
    """Events of the job until it ends, the last one carrying its ``Ending``: its state when it
    changes (PENDING with the reason, RUNNING on which nodes), pod 0's log lines (c10d puts rank 0
    on any pod: pod 0 is the rendezvous host), each failed pod's reason, and the ending. A job
    pending past ``pending_timeout_s`` is deleted (ending FAILED); one deleted by someone else ends
    CANCELLED."""
    cursor, seen, said_failed, started, failures = _LogCursor(), None, set(), clock(), 0
    while True:
        try:
            status = describe(handle, kube)
            failures = 0
        except KubeError as exc:
            if not exc.transient or failures >= API_RETRIES:
                raise
            failures += 1
            yield Event("state", f"{handle.name}: {exc}; asking again ({failures} of {API_RETRIES})")
            sleep(poll_s)
            continue
        if status is None:
            ending = Ending("CANCELLED", f"{handle.flavour} {handle.namespace}/{handle.name} was deleted by "
                                         "someone else; training stopped")
            yield Event("ending", ending.message, ending)
            return
        pod0 = next((p for p in status.pods if p.rank == 0 and p.phase != "Pending"), None)
        if pod0:
            for line in cursor.new_lines(handle, pod0.name, kube):
                yield Event("log", line)
        word = (status.state, status.reason, tuple(p.node for p in status.pods if p.node))
        if word != seen:
            seen = word
            where = f" on {', '.join(word[2])}" if status.state == "RUNNING" and word[2] else ""
            yield Event("state", f"{handle.name}: {status.state}{where}" + (f" ({status.reason})" if status.reason else ""))
        for p in status.pods:
            if p.phase == "Failed" and p.name not in said_failed:
                said_failed.add(p.name)
                code = f"exit code {p.exit_code}" if p.exit_code is not None else "no exit code"
                yield Event("error", f"pod {p.name} (node rank {p.rank}) failed: {code}"
                                     + (f" ({p.reason})" if p.reason else ""))
        if status.state not in ("PENDING", "RUNNING"):
            ending = _ending(handle, status, kube)
            yield Event("ending", ending.message, ending)
            return
        if status.state == "PENDING" and pending_timeout_s is not None and \
                clock() - started > pending_timeout_s:
            cancel(handle, kube)
            ending = Ending("FAILED", f"{handle.name}: still pending after {pending_timeout_s:g} s "
                                      f"({status.reason or 'waiting for pods'}); the job was deleted")
            yield Event("ending", ending.message, ending)
            return
        if status.state == "RUNNING":
            started = clock()  # the pending limit is for the wait before training, not during it
        sleep(poll_s)


def _ending(handle: Handle, status: Status, kube: Kube) -> Ending:
    nodes = tuple(dict.fromkeys(p.node for p in status.pods if p.node))
    where = f"{handle.flavour} {handle.namespace}/{handle.name}"
    if status.state == "COMPLETED":
        return Ending("COMPLETED", f"{where} completed", nodes=nodes)
    if status.state == "TIMEOUT":
        return Ending("TIMEOUT", f"{where} ran past its deadline (DeadlineExceeded); resuming from the "
                                 "last checkpoint", nodes=nodes)
    if status.state == "PREEMPTED":
        taken = next(p for p in status.pods if p.taken and p.phase == "Failed")
        return Ending("PREEMPTED", f"{where}: pod {taken.name} (node rank {taken.rank}) was taken away "
                                   f"({taken.reason or 'DisruptionTarget'}); resuming from the last checkpoint",
                      pod=taken.name, rank=taken.rank, nodes=nodes)
    failed = sorted((p for p in status.pods if p.phase == "Failed"),
                    key=lambda p: (p.finished_at or "~", p.rank if p.rank is not None else 1 << 30))
    if not failed:
        return Ending("FAILED", f"{where} failed ({status.reason or 'no reason given'}); no failed pod left to "
                                "name", nodes=nodes)
    first = failed[0]
    try:  # the failing container's last lines ("" when its log is gone)
        tail = _log(kube, first.name, handle, tail_lines=LOG_TAIL_LINES).rstrip("\n")
    except _errors():
        tail = ""
    last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
    on = f", on {first.node}" if first.node else ""
    return Ending("FAILED", f"{where} failed: pod {first.name} (node rank {first.rank}{on}) exited "
                            f"{first.exit_code}{f' ({first.reason})' if first.reason else ''}"
                            + (f": {last.strip()}" if last else ""),
                  pod=first.name, rank=first.rank, log_tail=tail, nodes=nodes)


def run(plan: LaunchPlan, kube: Kube, *, name: str, on_event=print, poll_s: float | None = None,
        sleep=time.sleep, on_submitted=None, on_ended=None, **render) -> tuple[Ending, list[str]]:
    """Submit ``plan`` (``dry_run``'s ``render`` arguments), follow it to its ending, and submit it again
    after PREEMPTED or TIMEOUT, up to ``training.max_restarts`` times, into the same training folder
    (the workers resume from its checkpoints). The job is deleted when this is interrupted (Ctrl-C,
    SIGTERM raised as an exception, a Prefect cancellation). ``on_submitted(handle)`` /
    ``on_ended(handle)``: each job as it is created / once it has ended or been deleted (the run's
    record of its live jobs). ``render["out_name"]``: the training folder under /shared (default
    ``name``). (last ending, names of the jobs)."""
    k = plan.cfg.launcher.kubernetes
    names, restarts = [], plan.cfg.training.max_restarts
    out_name = render.pop("out_name", None) or name
    while True:
        job_name = name if not names else f"{name[:48]}-r{len(names)}"
        request = dry_run(plan, name=job_name, out_name=out_name, **render)
        handle = submit(request, kube)
        names.append(job_name)
        try:
            if on_submitted:
                on_submitted(handle)
            ending = None
            for event in follow(handle, kube, k.poll_s if poll_s is None else poll_s, k.pending_timeout_s, sleep):
                on_event(event)
                ending = event.ending or ending
        except BaseException:
            cancel(handle, kube)
            if on_ended:
                on_ended(handle)
            raise
        if on_ended:
            on_ended(handle)
        if not ending.resume or len(names) > restarts:
            return ending, names
        on_event(Event("state", f"{job_name}: {ending.state}; submitting it again "
                                f"({len(names)} of {restarts} restarts)"))


def to_yaml(manifests: list[dict]) -> str:
    """Multi-document YAML, ready for ``kubectl apply -f -``."""
    import yaml

    return "---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests)


__all__ = ["Ending", "Event", "Handle", "Kube", "KubeError", "KubeRequest", "STATES", "cancel", "describe",
           "dry_run", "follow", "run", "submit", "to_yaml"]
