"""Multi-node training on Kubernetes: an indexed Job of N pods, a headless Service and a NetworkPolicy.

Each pod is one torchrun agent (``trainflow train --nnodes N --node-rank $JOB_COMPLETION_INDEX
--rdzv-endpoint <job>-0.<job>.<ns>.svc:29400 --rdzv-id <random>``); the pods meet at pod 0, which hosts
the c10d store. The store's agents unpickle what they read under the rendezvous id, so the id is random
per job and only the job's own pods may connect. Every pod checks out the same git commit, pulls the data
version with DVC and trains into a shared volume. The image is pinned by digest (recorded through
TRAINFLOW_IMAGE / TRAINFLOW_IMAGE_DIGEST); MLflow must be a tracking server (nodes share no sqlite file).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

from core.errors import PreemptedError

RDZV_PORT = 29400
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_RDZV_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")

# One shell line per pod: fetch the code and data version, then become the torchrun agent.
# "$@" are trainflow train's arguments; the node rank comes from the Job's completion index.
NODE_SCRIPT = (
    'set -eu; git clone --quiet "$TRAINFLOW_GIT_REPO" /workspace/src; cd /workspace/src; '
    'git checkout --quiet "$TRAINFLOW_GIT_REF"; dvc pull -q; '
    'exec trainflow train "$@" --node-rank "$JOB_COMPLETION_INDEX"'
)


@dataclass(frozen=True)
class MultiNodeJob:
    """What one multi-node training job needs; :func:`render` turns it into manifests."""

    name: str
    nnodes: int
    gpus_per_node: int
    image: str                       # REPO@sha256:... or REPO:TAG with image_digest
    git_repo: str
    git_ref: str
    mlflow_uri: str
    image_digest: str | None = None
    namespace: str = "default"
    config: str = "configs/digits.yaml"
    overrides: list[str] = field(default_factory=list)
    shared_pvc: str = "trainflow-shared"  # a ReadWriteMany claim every node mounts
    mlflow_run_id: str | None = None
    # Drawn once per job (every pod gets the same), 128 random bits nobody can guess.
    rdzv_id: str = field(default_factory=lambda: secrets.token_hex(16))
    mlflow_secret: str | None = None      # a Secret with MLFLOW_TRACKING_USERNAME/PASSWORD (an auth'd server)


def _image_by_digest(image: str, digest: str | None) -> tuple[str, str, str]:
    """(pinned ref for the pod, ref to record, digest); refuses a ref without a digest."""
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


def _check(job: MultiNodeJob) -> None:
    if not _DNS_LABEL.match(job.name):
        raise ValueError(f"name {job.name!r}: a DNS label of lowercase letters, digits and '-' (at most 52 chars)")
    if job.nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {job.nnodes}")
    if job.gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {job.gpus_per_node}")
    if not job.mlflow_uri.startswith(("http://", "https://")):
        raise ValueError(f"mlflow_uri {job.mlflow_uri!r}: multi-node ranks need an MLflow tracking server "
                         "(http[s]://...); nodes cannot share a sqlite file")
    if not job.git_repo or not job.git_ref:
        raise ValueError("git_repo and git_ref are required: every node checks out the same commit")
    if not _RDZV_ID.match(job.rdzv_id):
        raise ValueError(f"rdzv_id {job.rdzv_id!r}: 1-128 letters, digits, '.', '_' or '-'")


def rdzv_endpoint(job: MultiNodeJob) -> str:
    """Pod 0's stable DNS name (indexed Job hostname + headless Service subdomain) and the c10d port."""
    return f"{job.name}-0.{job.name}.{job.namespace}.svc:{RDZV_PORT}"


def train_args(job: MultiNodeJob) -> list[str]:
    """``trainflow train`` arguments shared by every node (the node rank is added per pod)."""
    return ["--config", job.config, "--out", f"/shared/{job.name}",
            "--nnodes", str(job.nnodes), "--nproc", str(job.gpus_per_node),
            "--rdzv-endpoint", rdzv_endpoint(job), "--rdzv-id", job.rdzv_id,
            *(a for item in job.overrides for a in ("--set", item))]


def render(job: MultiNodeJob) -> list[dict]:
    """[NetworkPolicy, headless Service, indexed Job] for ``job``; raises ValueError naming the bad field."""
    from core.env import TELEMETRY_OFF

    _check(job)
    pinned, ref, digest = _image_by_digest(job.image, job.image_digest)
    labels = {"app.kubernetes.io/name": "trainflow", "app.kubernetes.io/component": "train",
              "trainflow/job": job.name}

    def meta() -> dict:  # fresh copies: no shared objects, so the YAML has no anchors
        return {"name": job.name, "namespace": job.namespace, "labels": dict(labels)}

    def own_pods() -> dict:
        return {"matchLabels": {"trainflow/job": job.name}}

    # Only the job's own pods may connect to its pods (the c10d store, whose values agents unpickle, and
    # the collectives on ephemeral ports): peers get every port, nobody else any. Applied first.
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta(),
              "spec": {"podSelector": own_pods(), "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": own_pods()}]}]}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": meta(), "spec": {
        "clusterIP": "None",  # headless: DNS gives each pod <job>-<i>.<job>
        "publishNotReadyAddresses": True,  # the rendezvous happens before any pod is "ready"
        "selector": {"trainflow/job": job.name},
        "ports": [{"name": "c10d", "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}]}}
    env = [
        {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": "TRAINFLOW_IMAGE", "value": ref},
        {"name": "TRAINFLOW_IMAGE_DIGEST", "value": digest},
        {"name": "TRAINFLOW_GIT_REPO", "value": job.git_repo},
        {"name": "TRAINFLOW_GIT_REF", "value": job.git_ref},
        {"name": "MLFLOW_TRACKING_URI", "value": job.mlflow_uri},
        *([{"name": "TRAINFLOW_MLFLOW_RUN_ID", "value": job.mlflow_run_id}] if job.mlflow_run_id else []),
        {"name": "TRAINFLOW_HOME", "value": "/workspace/state"},
        *({"name": k, "value": v} for k, v in TELEMETRY_OFF.items()),
    ]
    resources = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(job.gpus_per_node)}
    pod_spec = {
        "subdomain": job.name,
        "restartPolicy": "Never",
        "containers": [{
            "name": "trainer",
            "image": pinned,
            "imagePullPolicy": "IfNotPresent",
            # Args only: the image's entrypoint (tini) stays, so SIGTERM reaches the agent
            # (preemption: checkpoint, exit 4).
            "args": ["sh", "-c", NODE_SCRIPT, "trainflow-node", *train_args(job)],
            "env": env,
            # Credentials from a Secret, never rendered into the manifest.
            **({"envFrom": [{"secretRef": {"name": job.mlflow_secret}}]} if job.mlflow_secret else {}),
            "ports": [{"name": "c10d", "containerPort": RDZV_PORT, "protocol": "TCP"}],
            "resources": {"limits": resources, "requests": dict(resources)},
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"},
                             {"name": "workspace", "mountPath": "/workspace"},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": job.shared_pvc}},
            {"name": "workspace", "emptyDir": {}},
            # NCCL and DataLoader workers use /dev/shm.
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    job_manifest = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(),
        "spec": {
            "completionMode": "Indexed",
            "completions": job.nnodes,
            "parallelism": job.nnodes,  # all agents at once: the rendezvous waits for nnodes
            "backoffLimit": 0,  # torchrun restarts workers inside a pod (training.max_restarts)
            # A node taken away (eviction, preemption) or a preempted agent (exit 4: it checkpointed)
            # does not count as a failure: the pod is recreated and training resumes from /shared.
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In",
                                                     "values": [PreemptedError.exit_code]}},
            ]},
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
    return [policy, service, job_manifest]


def to_yaml(manifests: list[dict]) -> str:
    """Multi-document YAML, ready for ``kubectl apply -f -``."""
    import yaml

    return "---\n".join(yaml.safe_dump(m, sort_keys=False) for m in manifests)
