"""The Kubernetes launcher without a cluster: what its dry run renders from a launch plan and the
``launcher.kubernetes`` section, checked against the schemas the API server would check (Job, Service
and NetworkPolicy with kubernetes-validate, strict; TrainJob against tests/schemas/trainjob-v1alpha1.json,
written from Kubeflow Trainer's CRD), and how pods' statuses read. (Submitting, following and
deleting against a fake API server: tests/integration/test_kube.py.)"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from core.config import config_from_dict, config_id_of, load_config
from core.errors import ConfigError
from training import kube
from training.plan import HostFacts, plan_launch

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example:5000/ml/trainflow@{DIGEST}"
REPO = "https://git.example/ml/trainflow.git"
K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
TRAINJOB_SCHEMA = json.loads((Path(__file__).parents[1] / "schemas" / "trainjob-v1alpha1.json").read_text())


@pytest.fixture
def plan(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))

    def make(*overrides: str, nnodes: int | str = 2, nproc: int = 4):
        cfg = load_config(repo_root / "configs" / "digits.yaml",
                          ["training.cpu_workers=1", f"launcher.kubernetes.image={IMAGE}",
                           f"launcher.kubernetes.git_repo={REPO}", "launcher.kubernetes.namespace=ml", *overrides])
        return plan_launch(cfg, HostFacts(), nproc=nproc, nnodes=nnodes)
    return make


def render(p, **kw):
    return kube.dry_run(p, **{"name": "digits-ddp", "git_ref": "0123abcd", "data_md5": "md5",
                              "mlflow_uri": "http://mlflow.ml.svc:5000", **kw})


def container(request):
    job = request.manifests[0]
    if job["kind"] == "Job":
        return job["spec"]["template"]["spec"]["containers"][0]
    return job["spec"]["trainer"]


def env_of(c) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_job_flavour_renders_a_valid_indexed_job_service_and_policy(plan, version):
    request = render(plan("launcher.kubernetes.gpus_per_node=4", "launcher.kubernetes.service_account=trainer",
                          "launcher.kubernetes.active_deadline_s=7200"))
    assert [m["kind"] for m in request.manifests] == ["Job", "NetworkPolicy", "Service"]
    for m in request.manifests:
        kubernetes_validate.validate(m, version, strict=True)
    job = request.manifests[0]
    assert job["metadata"]["namespace"] == "ml" and request.namespace == "ml"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert job["spec"]["activeDeadlineSeconds"] == 7200
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert container(request)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container(request)["image"] == IMAGE


def test_each_pod_runs_the_local_launchers_agent_command_for_the_plan(plan):
    p = plan()
    request = render(p, rdzv_id="f" * 32)
    args = container(request)["args"]
    assert args[:2] == ["sh", "-c"] and 'exec "$@"' in args[2]
    command = args[4:]
    assert command[:3] == ["python", "-m", "training.agent"]
    assert "--nnodes=2" in command and "--nproc-per-node=4" in command and "--rdzv-backend=c10d" in command
    # Pod 0 hosts the c10d store, found through the headless Service; the kubelet fills in the index.
    assert "--rdzv-endpoint=digits-ddp-0.digits-ddp.ml.svc:29400" in command
    assert "--node-rank=$(JOB_COMPLETION_INDEX)" in command and f"--rdzv-id={'f' * 32}" in command
    assert f"--max-restarts={p.cfg.training.max_restarts}" in command
    assert command[command.index("--config") + 1] == "/workspace/config.yaml"
    assert command[command.index("--out") + 1] == "/shared/digits-ddp"
    assert command[command.index("--root") + 1] == "/workspace/src"
    env = env_of(container(request))
    assert "job-completion-index" in env["JOB_COMPLETION_INDEX"]["fieldRef"]["fieldPath"]
    assert env["TRAINFLOW_GIT_REF"] == "0123abcd" and env["TRAINFLOW_GIT_REPO"] == REPO
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.ml.svc:5000" and env["DO_NOT_TRACK"] == "true"
    assert env["TRAINFLOW_NNODES"] == "2"
    # The workers read the plan's own config (auto resolved), not the file it came from.
    assert config_from_dict(__import__("yaml").safe_load(env["TRAINFLOW_CONFIG"])).config_id() == p.cfg.config_id()


def test_the_service_and_policy_select_exactly_the_jobs_pods(plan):
    job, policy, service = render(plan()).manifests
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"] == service["spec"]["selector"]
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": service["spec"]["selector"]}}]
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"] == "digits-ddp"


def test_rendezvous_id_is_drawn_per_job(plan):
    p = plan()
    ids = {next(a for a in container(render(p))["args"] if a.startswith("--rdzv-id=")) for _ in range(3)}
    assert len(ids) == 3


def test_a_resubmission_trains_into_the_first_jobs_folder(plan):
    request = render(plan(), name="digits-ddp-r1", out_name="digits-ddp")
    args = container(request)["args"]
    assert args[args.index("--out") + 1] == "/shared/digits-ddp" == request.out_dir
    assert "--rdzv-endpoint=digits-ddp-r1-0.digits-ddp-r1.ml.svc:29400" in args


def test_the_trainjob_flavour_matches_the_trainjob_crd_schema(plan):
    request = render(plan("launcher.kubernetes.flavour=trainjob", "launcher.kubernetes.gpus_per_node=8",
                          "launcher.kubernetes.active_deadline_s=3600"))
    assert [m["kind"] for m in request.manifests] == ["TrainJob", "NetworkPolicy"]
    job, policy = request.manifests
    jsonschema.validate(job, TRAINJOB_SCHEMA)
    kubernetes_validate.validate(policy, K8S_VERSIONS[-1], strict=True)
    spec = job["spec"]
    assert spec["runtimeRef"] == {"name": "torch-distributed", "apiGroup": "trainer.kubeflow.org",
                                  "kind": "ClusterTrainingRuntime"}
    t = spec["trainer"]
    assert t["numNodes"] == 2 and t["numProcPerNode"] == 4
    assert "command" not in t and t["args"][:2] == ["sh", "-c"]  # the image's entrypoint stays
    assert t["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    # Trainer's torch runtime gives each node the master's address and its rank.
    assert "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)" in t["args"]
    assert "--node-rank=$(PET_NODE_RANK)" in t["args"]
    assert not any(e["name"].startswith("PET_") for e in t["env"])  # reserved: the runtime sets them
    # The policy guards the JobSet's pods.
    assert policy["spec"]["podSelector"]["matchLabels"] == {"jobset.sigs.k8s.io/jobset-name": "digits-ddp"}


@pytest.mark.parametrize("breakage", ["unknown_field", "nodes_as_text", "no_runtime", "bad_name", "bad_quantity"])
def test_the_trainjob_schema_rejects_broken_manifests(plan, breakage):
    job = copy.deepcopy(render(plan("launcher.kubernetes.flavour=trainjob")).manifests[0])
    if breakage == "unknown_field":
        job["spec"]["trainer"]["numNode"] = job["spec"]["trainer"].pop("numNodes")
    elif breakage == "nodes_as_text":
        job["spec"]["trainer"]["numNodes"] = "two"
    elif breakage == "no_runtime":
        del job["spec"]["runtimeRef"]
    elif breakage == "bad_name":
        job["metadata"]["name"] = "Digits_DDP"
    else:
        job["spec"]["trainer"]["resourcesPerNode"]["limits"]["memory"] = "lots"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(job, TRAINJOB_SCHEMA)


@pytest.mark.parametrize(("overrides", "kw", "message"), [
    ((), dict(mlflow_uri="sqlite:///mlflow.db"), "cannot share a sqlite file"),
    ((), dict(git_ref=""), "same one"),
    ((), dict(name="Digits_DDP"), "DNS label"),
    (("launcher.kubernetes.image=null",), {}, "launcher.kubernetes.image: required"),
    (("launcher.kubernetes.git_repo=null",), {}, "launcher.kubernetes.git_repo: required"),
    (("launcher.kubernetes.flavour=trainjob", "launcher.kubernetes.service_account=x"), {}, "the training runtime's"),
])
def test_bad_settings_are_refused_naming_the_key(plan, overrides, kw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        render(plan(*overrides), **kw)


def test_an_elastic_range_is_refused(plan):
    with pytest.raises(ConfigError, match="fixed number of pods"):
        render(plan(nnodes="1:2"))


@pytest.mark.parametrize(("override", "message"), [
    ("launcher.kubernetes.image=registry.example/ml/trainflow:1.4", "launcher.kubernetes.image: must match"),
    ("launcher.kubernetes.namespace=ML_team", "launcher.kubernetes.namespace: must match"),
    ("launcher.kubernetes.flavour=pytorchjob", "launcher.kubernetes.flavour: must be one of"),
    ("launcher.kubernetes.memory=lots", "launcher.kubernetes.memory: must match"),
    ("launcher.kubernetes.podSpec=x", "launcher.kubernetes.podSpec: unknown key"),
])
def test_the_config_section_fails_at_load_with_the_key_path(repo_root, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(repo_root / "configs" / "digits.yaml", [override])


def test_the_section_is_not_part_of_the_config_id(repo_root):
    plain = load_config(repo_root / "configs" / "digits.yaml", [])
    placed = load_config(repo_root / "configs" / "digits.yaml", [f"launcher.kubernetes.image={IMAGE}",
                                                                 "launcher.kubernetes.flavour=trainjob"])
    assert placed.config_id() == plain.config_id() == config_id_of(plain.model_dump(mode="json"))


def _pod(phase, index=0, **status):
    return {"metadata": {"name": f"digits-ddp-{index}-x", "annotations": {kube.INDEX_KEY: str(index)}},
            "spec": {"nodeName": "gpu-a", "containers": [{"name": "trainer"}]}, "status": {"phase": phase, **status}}


def _terminated(code, reason=""):
    return {"containerStatuses": [{"name": "trainer", "state": {"terminated": {
        "exitCode": code, "reason": reason, "finishedAt": "2026-12-05T23:00:00Z"}}}]}


@pytest.mark.parametrize(("pod", "taken", "reason"), [
    (_pod("Failed", **_terminated(1, "Error")), False, "Error"),
    (_pod("Failed", 1, reason="Evicted"), True, "Evicted"),
    (_pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True"}], **_terminated(137)), True, ""),
    (_pod("Failed", **_terminated(4)), True, ""),  # the agent checkpointed on SIGTERM (exit 4)
    (_pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]),
     False, "Unschedulable"),
    (_pod("Pending", containerStatuses=[{"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
     False, "ImagePullBackOff"),
])
def test_a_pods_status_says_whether_the_cluster_took_it_away(pod, taken, reason):
    state = kube._pod_state(pod, "job")
    assert state.taken is taken and state.reason.startswith(reason)
    assert state.rank == int(pod["metadata"]["annotations"][kube.INDEX_KEY])


def test_log_timestamps_order_across_trimmed_fractions():
    assert kube._stamp_key("2026-12-05T23:00:00.5Z") > kube._stamp_key("2026-12-05T23:00:00.123456789Z")
    assert kube._stamp_key("2026-12-05T23:00:01Z") > kube._stamp_key("2026-12-05T23:00:00.999Z")


def test_the_cli_refuses_auto_strategy_for_pods_in_one_line(repo_root, tmp_path, monkeypatch, capsys):
    from flows.cli import main

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    code = main(["k8s-launch", "--config", str(repo_root / "configs" / "digits.yaml"), "--nnodes", "2", "--nproc", "2",
                 "--git-ref", "0123abcd", "--mlflow-uri", "http://m:5000", "--set", "training.strategy=auto"])
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("trainflow: error: k8s-launch: training.strategy: auto is decided on the host that trains")
    assert len(err.strip().splitlines()) == 1
