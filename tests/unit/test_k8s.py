"""The multi-node Kubernetes job: rendered for N nodes, valid against the Kubernetes schema
(strict: unknown fields fail), each pod's arguments make the right torchrun agent, under a
random rendezvous id, and a NetworkPolicy keeps every other pod away from the job's pods.
No cluster exists here; the validator is shown to reject broken manifests."""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
import yaml

from core.manifest import image_from_env
from flows.cli import build_parser, main
from flows.k8s import MultiNodeJob, render, train_args

K8S_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]
DIGEST = "sha256:" + "ab" * 32


def _job(nnodes: int, **kw) -> MultiNodeJob:
    base = dict(name="digits-ddp", namespace="ml", nnodes=nnodes, gpus_per_node=8,
                image=f"registry.example:5000/ml/trainflow:1.4@{DIGEST}",
                git_repo="https://git.example/ml/trainflow.git", git_ref="0123abcd",
                mlflow_uri="http://mlflow.ml.svc:5000", overrides=["training.epochs=3"])
    return MultiNodeJob(**{**base, **kw})


def _pod(manifests):
    job = next(m for m in manifests if m["kind"] == "Job")
    return job, job["spec"]["template"]["spec"], job["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("nnodes", [2, 4])
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_job_and_service_validate_strictly(nnodes, version):
    manifests = render(_job(nnodes))
    assert [m["kind"] for m in manifests] == ["NetworkPolicy", "Service", "Job"]
    for m in manifests:
        kubernetes_validate.validate(m, version, strict=True)


@pytest.mark.parametrize("nnodes", [2, 4])
def test_n_indexed_pods_with_gpus_meet_at_pod_zero(nnodes):
    _, service, job_manifest = render(_job(nnodes))
    job, pod, c = _pod([job_manifest])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == nnodes
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # The headless Service selects exactly these pods and is their DNS subdomain.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert pod["subdomain"] == service["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    assert port in [p["containerPort"] for p in c["ports"]]
    args = c["args"]
    endpoint = args[args.index("--rdzv-endpoint") + 1]
    assert endpoint == f"{job['metadata']['name']}-0.{pod['subdomain']}.ml.svc:{port}"
    env = {e["name"]: e for e in c["env"]}
    assert "job-completion-index" in env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert '--node-rank "$JOB_COMPLETION_INDEX"' in args[2]


def test_image_runs_by_digest_and_the_manifest_records_ref_and_digest(monkeypatch):
    _, _, c = _pod(render(_job(2)))
    assert c["image"] == f"registry.example:5000/ml/trainflow@{DIGEST}"
    env = {e["name"]: e.get("value") for e in c["env"]}
    monkeypatch.setenv("TRAINFLOW_IMAGE", env["TRAINFLOW_IMAGE"])
    monkeypatch.setenv("TRAINFLOW_IMAGE_DIGEST", env["TRAINFLOW_IMAGE_DIGEST"])
    recorded = image_from_env()  # what the manifest of a run inside this pod records
    assert recorded.ref == f"registry.example:5000/ml/trainflow:1.4@{DIGEST}"
    assert recorded.digest == DIGEST
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.ml.svc:5000"
    assert env["DO_NOT_TRACK"] == "true" and env["MLFLOW_DISABLE_TELEMETRY"] == "true"


@pytest.mark.parametrize("nnodes", [2, 4])
def test_each_pod_becomes_a_c10d_torchrun_agent(nnodes, tmp_path, repo_root, monkeypatch):
    from core.config import load_config
    from training.launcher import make_spec
    from training.plan import HostFacts, plan_launch

    job = _job(nnodes)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    for rank in range(nnodes):
        # What the pod's shell runs: trainflow train "$@" --node-rank $JOB_COMPLETION_INDEX
        args = build_parser().parse_args(["train", *train_args(job), "--node-rank", str(rank)])
        cfg = load_config(repo_root / args.config, args.overrides)
        plan = plan_launch(cfg, HostFacts(), args.nproc, args.nnodes)
        spec = make_spec(plan, tmp_path / f"out{rank}", repo_root, "md5",
                         node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id)
        cmd = spec.command(tmp_path / "logs")
        assert f"--nnodes={nnodes}" in cmd and "--nproc-per-node=8" in cmd
        assert f"--node-rank={rank}" in cmd and "--rdzv-backend=c10d" in cmd
        assert "--rdzv-endpoint=digits-ddp-0.digits-ddp.ml.svc:29400" in cmd and "--standalone" not in cmd
        assert cfg.training.epochs == 3


@pytest.mark.parametrize("breakage", ["misspelled_field", "wrong_type", "bad_gpu_quantity", "missing_containers"])
def test_validator_rejects_broken_manifests(breakage):
    job = render(_job(2))[-1]
    bad = copy.deepcopy(job)
    if breakage == "misspelled_field":
        bad["spec"]["completionsMode"] = bad["spec"].pop("completionMode")
    elif breakage == "wrong_type":
        bad["spec"]["parallelism"] = "two"
    elif breakage == "bad_gpu_quantity":
        bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = ["8"]
    else:
        del bad["spec"]["template"]["spec"]["containers"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize(("change", "message"), [
    (dict(image="registry.example/ml/trainflow:1.4"), "REPO@sha256"),
    (dict(image=f"r/t@{DIGEST}", image_digest="sha256:" + "cd" * 32), "carries digest"),
    (dict(image="r/t", image_digest="sha256:short"), "expected sha256:<64 hex>"),
    (dict(mlflow_uri="sqlite:///mlflow.db"), "cannot share a sqlite file"),
    (dict(name="Digits_DDP"), "DNS label"),
    (dict(nnodes=0), "nnodes must be >= 1"),
    (dict(git_ref=""), "same commit"),
    (dict(rdzv_id="a b"), "rdzv_id 'a b'"),
])
def test_bad_input_names_the_field(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render(_job(**{"nnodes": 2, **change}))


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_mlflow_credentials_come_from_a_secret_not_the_manifest(version):
    manifests = render(_job(2, mlflow_secret="mlflow-team-credentials"))
    job, _, c = _pod(manifests)
    kubernetes_validate.validate(job, version, strict=True)
    assert c["envFrom"] == [{"secretRef": {"name": "mlflow-team-credentials"}}]
    assert not [e for e in c["env"] if e["name"].startswith("MLFLOW_TRACKING_") and e["name"] != "MLFLOW_TRACKING_URI"]
    assert "envFrom" not in _pod(render(_job(2)))[2]


def test_tagged_image_with_separate_digest_is_pinned():
    _, _, c = _pod(render(_job(2, image="registry.example:5000/ml/trainflow:1.4", image_digest=DIGEST)))
    assert c["image"] == f"registry.example:5000/ml/trainflow@{DIGEST}"


def test_cli_prints_the_same_manifests(capsys):
    job = _job(4)
    code = main(["k8s-job", "--name", job.name, "--namespace", job.namespace, "--nnodes", "4",
                 "--gpus-per-node", "8", "--image", job.image, "--git-repo", job.git_repo,
                 "--git-ref", job.git_ref, "--mlflow-uri", job.mlflow_uri, "--set", "training.epochs=3",
                 "--rdzv-id", job.rdzv_id])
    assert code == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == render(job)


def _rdzv_id(manifests) -> str:
    args = _pod(manifests)[2]["args"]
    return args[args.index("--rdzv-id") + 1]


def test_rendezvous_id_is_random_per_job_and_shared_by_its_pods(capsys):
    # Not the job's name nor a constant: anyone who can reach the port and guess the id can feed
    # the agents a pickle.
    ids = {_rdzv_id(render(_job(2))) for _ in range(3)}
    assert len(ids) == 3
    for rid in ids:
        assert re.fullmatch(r"[0-9a-f]{32}", rid) and rid != "digits-ddp"
    # One job: all pods run the same arguments, so they share the one id drawn for it.
    job = _job(4)
    assert _rdzv_id(render(job)) == _rdzv_id(render(job)) == job.rdzv_id
    # The CLI draws a fresh one each time it is asked for a job.
    argv = ["k8s-job", "--nnodes", "2", "--gpus-per-node", "1", "--image", f"r/t@{DIGEST}",
            "--git-repo", "x", "--git-ref", "y", "--mlflow-uri", "http://m:5000"]
    printed = []
    for _ in range(2):
        assert main(argv) == 0
        printed.append(_rdzv_id(list(yaml.safe_load_all(capsys.readouterr().out))))
    assert printed[0] != printed[1]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_network_policy_admits_only_the_jobs_own_pods(version):
    policy, service, job = render(_job(2))
    kubernetes_validate.validate(policy, version, strict=True)
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == job["metadata"]["namespace"]
    # It selects the job's pods (the rendezvous port behind the Service is theirs) ...
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["podSelector"]["matchLabels"] == service["spec"]["selector"]
    assert spec["policyTypes"] == ["Ingress"]
    # ... and its one rule admits nothing but those same pods: no namespaceSelector, ipBlock or
    # empty peer (which would admit everyone).
    [rule] = spec["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": spec["podSelector"]["matchLabels"]}}]
    assert spec["podSelector"]["matchLabels"]


def test_single_node_endpoint_draws_a_rendezvous_id_and_several_nodes_need_one(tmp_path, repo_root, monkeypatch):
    from core.config import load_config
    from core.errors import ConfigError
    from training.launcher import make_spec
    from training.plan import HostFacts, plan_launch

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    cfg = load_config(repo_root / "configs" / "digits.yaml", [])
    ids = {make_spec(plan_launch(cfg, HostFacts(), 1), tmp_path / f"o{i}", repo_root, "md5",
                     rdzv_endpoint="127.0.0.1:29400").rdzv_id for i in range(2)}
    assert len(ids) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    with pytest.raises(ConfigError, match="--nnodes > 1 needs --rdzv-id"):
        make_spec(plan_launch(cfg, HostFacts(), 1, 2), tmp_path / "o3", repo_root, "md5",
                  rdzv_endpoint="127.0.0.1:29400")


def test_cli_bad_input_exits_1_with_one_line(capsys):
    code = main(["k8s-job", "--nnodes", "2", "--gpus-per-node", "1", "--image", "r/t:latest",
                 "--git-repo", "x", "--git-ref", "y", "--mlflow-uri", "http://m:5000"])
    assert code == 1
    assert capsys.readouterr().err.startswith("trainflow: error: k8s-job: image r/t:latest")


def test_preemption_recreates_the_pod_instead_of_failing_the_job():
    from flows.cli import EXIT_PREEMPTED

    job = render(_job(2))[-1]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]} in rules
    codes = next(r["onExitCodes"] for r in rules if "onExitCodes" in r)
    assert codes["operator"] == "In" and codes["values"] == [EXIT_PREEMPTED]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # required by podFailurePolicy
