"""``trainflow k8s-job``: an indexed Job of N pods, a headless Service and a NetworkPolicy, printed for
``kubectl apply`` (the launcher that submits and follows a run's job is ``training.kube``).

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

from training.kube import (INDEX_KEY, RDZV_PORT, headless_service, indexed_job, network_policy, pin_image,
                           to_yaml, trainer_pod)

__all__ = ["MultiNodeJob", "RDZV_PORT", "cluster_plan", "rdzv_endpoint", "render", "to_yaml", "train_args"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
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
    pinned, ref, digest = pin_image(job.image, job.image_digest)
    labels = {"app.kubernetes.io/name": "trainflow", "app.kubernetes.io/component": "train",
              "trainflow/job": job.name}
    own = {"trainflow/job": job.name}
    env = [
        {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}},
        {"name": "TRAINFLOW_IMAGE", "value": ref},
        {"name": "TRAINFLOW_IMAGE_DIGEST", "value": digest},
        {"name": "TRAINFLOW_GIT_REPO", "value": job.git_repo},
        {"name": "TRAINFLOW_GIT_REF", "value": job.git_ref},
        {"name": "MLFLOW_TRACKING_URI", "value": job.mlflow_uri},
        *([{"name": "TRAINFLOW_MLFLOW_RUN_ID", "value": job.mlflow_run_id}] if job.mlflow_run_id else []),
        {"name": "TRAINFLOW_HOME", "value": "/workspace/state"},
        *({"name": k, "value": v} for k, v in TELEMETRY_OFF.items()),
    ]
    pod = trainer_pod(job.name, pinned, ["sh", "-c", NODE_SCRIPT, "trainflow-node", *train_args(job)], env,
                      job.gpus_per_node, job.shared_pvc, job.mlflow_secret)
    # The policy first: applied before any pod exists.
    return [network_policy(job.name, job.namespace, labels, own), headless_service(job.name, job.namespace, labels, own),
            indexed_job(job.name, job.namespace, labels, job.nnodes, pod)]


def cluster_plan(cfg, nproc: int, nnodes: int):
    """The launch plan for ``nnodes`` pods of ``nproc`` workers as the config's ``launcher.kubernetes``
    asks for them (its GPUs, not this host's). ConfigError where a rule for ``auto`` would need to
    measure the pods."""
    from core.errors import ConfigError
    from training.plan import HostFacts, plan_launch

    if cfg.training.strategy == "auto":
        raise ConfigError("training.strategy: auto is decided on the host that trains; for pods on a cluster "
                          "name one (ddp, fsdp, ...)")
    return plan_launch(cfg, HostFacts(gpus=cfg.launcher.kubernetes.gpus_per_node), nproc, nnodes)
