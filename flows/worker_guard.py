"""The guarded worker: a flow run executes only as a deployment of the checkout's prefect.yaml.

In Prefect's open-source server any API caller may create deployments and flow runs with their own
job variables (``env``, ``command``, ``working_dir``) and pull steps. So before anything of a run
executes, :func:`refusal` compares the run and its deployment with the committed file, and a run that
differs goes to Failed with a one-line reason. Two places check:

- ``trainflow worker`` (:class:`GuardedProcessWorker`), before it starts a process: a run's environment
  reaches the new process before any Python code of it runs (``LD_PRELOAD``, ``PYTHONPATH``).
- the locked pool's command (``python -I -m flows.worker_guard --repo ...``), in the flow-run process:
  it runs the committed pull steps (from the file, not the API's copy, which could change after the
  check) and hands over to Prefect's engine with the committed entrypoint; ``-I`` keeps ``PYTHON*``
  variables out. This layer also holds where a plain ``prefect worker`` serves the pool.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import re
import shlex
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import yaml

# A flow run's own job variables may set only these environment variables: the state folder, and
# only inside the worker's ``--home-root`` (without one, not at all).
ALLOWED_RUN_ENV = ("TRAINFLOW_HOME",)
HOME_VAR = "TRAINFLOW_HOME"
GUARD_MODULE = "flows.worker_guard"
REFUSED = "Refused by the trainflow worker guard: "  # what a refused run's state message starts with
_PLACEHOLDER = re.compile(r"\{\{\s*\$(\w+)\s*\}\}")
# Where the image built from docker/Dockerfile holds its interpreter and its checkout.
IMAGE_PYTHON, IMAGE_REPO = "/opt/venv/bin/python", "/app"


def _map_strings(value: Any, fn: Callable[[str], Any]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    return value


def committed_deployments(prefect_file: Path, values: dict[str, str]) -> dict[str, dict]:
    """``name -> {entrypoint, pull_steps, work_pool_name, job_variables}`` of ``prefect_file``, its
    ``{{ $NAME }}`` placeholders filled from ``values`` (what ``prefect deploy`` filled in)."""
    spec = yaml.safe_load(prefect_file.read_text()) or {}

    def fill(text: str) -> str:
        return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)

    return {dep["name"]: _map_strings({
        "entrypoint": dep.get("entrypoint"),
        "pull_steps": dep.get("pull", spec.get("pull")) or [],
        "work_pool_name": (dep.get("work_pool") or {}).get("name"),
        "job_variables": (dep.get("work_pool") or {}).get("job_variables") or {},
    }, fill) for dep in spec.get("deployments") or []}


def refusal(flow_run: dict, deployment: dict | None, committed: dict[str, dict], source: str,
            allow_env: tuple[str, ...] = ALLOWED_RUN_ENV, home_root: Path | None = None) -> str | None:
    """Why this run (the API's JSON) may not execute here, in one line naming the field; ``None`` when it
    matches. Parameters: :func:`parameter_refusal`, once the entrypoint is known to be a committed one."""
    if deployment is None:
        return f"flow run has no deployment; only the deployments in {source} run on this worker"
    name = deployment.get("name")
    want = committed.get(name)
    if want is None:
        return f"deployment {name!r} is not in {source}"
    for key, what in (("entrypoint", "entrypoint"), ("work_pool_name", "work pool")):
        if deployment.get(key) != want[key]:
            return f"deployment {name!r}: {what} {deployment.get(key)!r} differs from {source} ({want[key]!r})"
    got_steps, want_steps = deployment.get("pull_steps") or [], want["pull_steps"]
    if got_steps != want_steps:
        index = next((i for i, (a, b) in enumerate(zip(got_steps, want_steps)) if a != b),
                     min(len(got_steps), len(want_steps)))
        return f"deployment {name!r}: pull step {index + 1} differs from {source}"
    got_vars, want_vars = deployment.get("job_variables") or {}, want["job_variables"]
    if got_vars != want_vars:
        key = sorted(set(got_vars) ^ set(want_vars) | {k for k in got_vars if got_vars[k] != want_vars.get(k)})
        return f"deployment {name!r}: job variable {key[0]!r} differs from {source}"
    allowed = f"is not allowed in a flow run (allowed: env.{', env.'.join(allow_env)})"
    for key, value in (flow_run.get("job_variables") or {}).items():
        if key != "env" or not isinstance(value, dict):
            return f"job variable {key!r} {allowed}"
        for var in value:
            if var not in allow_env:
                return f"job variable env.{var} {allowed}"
        # Not a return on a good state folder: the job variables after ``env`` are still to be checked.
        if HOME_VAR in value and (reason := _home_refusal(str(value[HOME_VAR]), home_root)):
            return reason
    return None


def _home_refusal(home: str, root: Path | None) -> str | None:
    """A run's own state folder must be an absolute path inside the worker's ``--home-root``."""
    if root is None:
        return (f"job variable env.{HOME_VAR} is not allowed in a flow run: this worker has no --home-root "
                "to choose state folders in")
    path = Path(home)
    if not path.is_absolute() or not path.resolve().is_relative_to(root.resolve()):
        return f"job variable env.{HOME_VAR} {home!r} is not inside the worker's --home-root {str(root)!r}"
    return None


_FLOWS: dict[str, Any] = {}


def parameter_refusal(flow_run: dict, entrypoint: str, repo: Path) -> str | None:
    """Why the run's parameters are not valid for the committed flow's typed signature (the server's
    schema check can be switched off by the caller, and the schema rewritten)."""
    from prefect.exceptions import ParameterTypeError, SignatureMismatchError
    from prefect.flows import load_flow_from_entrypoint

    if entrypoint not in _FLOWS:
        if str(repo) not in sys.path:
            sys.path.insert(0, str(repo))
        _FLOWS[entrypoint] = load_flow_from_entrypoint(str(repo / entrypoint))
    try:
        _FLOWS[entrypoint].validate_parameters(flow_run.get("parameters") or {})
    except (ParameterTypeError, SignatureMismatchError) as exc:
        return "parameters: " + " ".join(str(exc).split())[:400]
    return None


class Guard:
    """The committed deployments of one checkout, and the check of a run against them."""

    def __init__(self, repo: Path, prefect_file: str = "prefect.yaml", values: dict[str, str] | None = None,
                 allow_env: tuple[str, ...] = ALLOWED_RUN_ENV, home_root: Path | None = None):
        self.repo = repo.resolve()
        self.source = prefect_file
        self.values = {"TRAINFLOW_REPO_DIR": str(self.repo), **(values or {})}
        self.allow_env = tuple(allow_env)
        self.home_root = Path(home_root).resolve() if home_root else None
        self.committed = committed_deployments(self.repo / prefect_file, self.values)

    def check(self, flow_run: dict, deployment: dict | None) -> str | None:
        return (refusal(flow_run, deployment, self.committed, self.source, self.allow_env, self.home_root)
                or parameter_refusal(flow_run, deployment["entrypoint"], self.repo))

    def command(self, python: str = sys.executable, repo: str | None = None) -> str:
        """The locked pool's command: this check in the flow-run process (checkout ``repo``), then Prefect's."""
        args = [python, "-I", "-m", GUARD_MODULE, "--repo", repo or str(self.repo), "--prefect-file", self.source]
        args += [a for n, v in sorted(self.values.items()) if n != "TRAINFLOW_REPO_DIR" for a in ("--set", f"{n}={v}")]
        args += [a for n in self.allow_env for a in ("--allow-env", n)]
        if self.home_root is not None:
            args += ["--home-root", str(self.home_root)]
        return shlex.join(args)


def locked_template(guard: Guard, base: dict | None = None, python: str = sys.executable, repo: str | None = None,
                    image: str | None = None) -> dict:
    """``base`` (Prefect's process template by default) with its ``{{ command }}``, ``{{ working_dir }}`` and
    ``{{ image }}`` slots fixed to the guard's command, the checkout and the image: a run's job variables of
    those names fill nothing. ``env`` stays a variable (Prefect merges a run's anyway): the guard checks it."""
    if base is None:
        from prefect.workers.process import ProcessWorker

        base = ProcessWorker.get_default_base_job_template()
    template = copy.deepcopy(base)
    fixed = {"command": guard.command(python, repo), "working_dir": repo or str(guard.repo), "image": image}

    def lock(value: str) -> str:
        slot = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", value)
        if not slot or slot.group(1) not in fixed:
            return value
        if fixed[slot.group(1)] is None:
            raise ValueError(f"the job template takes '{slot.group(1)}' from each run; give it a fixed value")
        return fixed[slot.group(1)]

    template["job_configuration"] = _map_strings(template["job_configuration"], lock)
    variables = template["variables"]
    props = variables.setdefault("properties", {})
    for key in fixed:
        props.pop(key, None)
    if "required" in variables:
        variables["required"] = [k for k in variables["required"] if k not in fixed]
    if "env" in props:
        props["env"]["description"] = (f"Only {', '.join(guard.allow_env)} may be set ({HOME_VAR} inside "
                                       f"{guard.home_root or 'the --home-root of a worker that has one'}); the "
                                       "trainflow worker guard refuses a run that sets any other variable.")
    return template


def is_locked(template: dict) -> bool:
    """Whether a pool's base job template runs the guard as its fixed command."""
    command = ((template or {}).get("job_configuration") or {}).get("command")
    return isinstance(command, str) and "{{" not in command and f"-m {GUARD_MODULE}" in command


def placeholders(prefect_file: Path) -> list[str]:
    """The ``{{ $NAME }}`` variables a deployments file names, in order of first use."""
    return list(dict.fromkeys(_PLACEHOLDER.findall(prefect_file.read_text())))


def pool_template(guard: Guard, kind: str = "process", base: dict | None = None) -> dict:
    """The locked base job template for a ``kind`` pool: a process pool runs the guard in this checkout;
    a docker or kubernetes pool runs it in the image named by ``TRAINFLOW_IMAGE`` (fixed in the template)."""
    if kind == "process":
        return locked_template(guard, base)
    if base is None:
        if kind == "docker":
            from prefect_docker.worker import DockerWorker as worker
        else:
            from prefect_kubernetes.worker import KubernetesWorker as worker
        base = worker.get_default_base_job_template()
    return locked_template(guard, base, python=IMAGE_PYTHON, repo=IMAGE_REPO, image=guard.values.get("TRAINFLOW_IMAGE"))


async def create_pool(name: str, template: dict, kind: str = "process") -> None:
    """Create the pool ``name`` with ``template``, or lock the existing one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=name, type=kind, base_job_template=template))
        except ObjectAlreadyExists:
            await client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))


async def serve(pool: str, guard: Guard, limit: int | None = None) -> None:
    """Run a guarded process worker on ``pool`` until stopped, warning when the pool is not locked."""
    from prefect.exceptions import Abort
    from prefect.states import Failed
    from prefect.utilities.engine import propose_state
    from prefect.workers.process import ProcessWorker, ProcessWorkerResult

    warnings.filterwarnings("ignore", message="Type 'GuardedProcessWorker'", category=UserWarning)

    class GuardedProcessWorker(ProcessWorker):
        """Prefect's process worker that runs nothing of a flow run the :class:`Guard` refuses."""

        async def run(self, flow_run, configuration, task_status=None):
            started = time.perf_counter()
            deployment = None
            if flow_run.deployment_id:
                deployment = (await self.client.read_deployment(flow_run.deployment_id)).model_dump(mode="json")
            reason = guard.check(flow_run.model_dump(mode="json"), deployment)
            logger = self.get_flow_run_logger(flow_run)
            if reason is None:
                logger.info(f"Worker guard: the run matches {guard.source} "
                            f"({(time.perf_counter() - started) * 1000:.0f} ms)")
                return await super().run(flow_run, configuration, task_status)
            logger.error(f"Worker guard refused the run: {reason}")
            with contextlib.suppress(Abort):  # the run ended already
                await propose_state(self.client, Failed(message=REFUSED + reason), flow_run_id=flow_run.id)
            if task_status is not None:
                task_status.started(-1)
            return ProcessWorkerResult(status_code=0, identifier="refused")

    async with GuardedProcessWorker(work_pool_name=pool, limit=limit, create_pool_if_not_found=False) as worker:
        await worker.sync_with_backend()
        if worker.work_pool is not None and not is_locked(worker.work_pool.base_job_template):
            logging.getLogger("trainflow").warning(
                "work pool %r is not locked: any caller of the Prefect API can run code through a plain worker "
                "on it; lock it with `trainflow pool create %s`", pool, pool)
        await worker.start()


def _pull(steps: list, deployment, flow_run) -> None:
    """Run ``steps`` as Prefect's engine runs a deployment's pull steps, into the directory they name."""
    import asyncio

    from prefect.deployments.steps.core import run_steps
    from prefect.logging.loggers import flow_run_logger

    logger = flow_run_logger(flow_run)
    logger.info(f"Running {len(steps)} pull step(s) of the committed deployment")
    output = asyncio.run(run_steps(steps, print_function=logger.info, deployment=deployment, flow_run=flow_run,
                                   logger=logger))
    if output.get("directory"):
        os.chdir(output["directory"])


def _fail(client, flow_run_id, reason: str, line: str, prefix: str = REFUSED) -> int:
    """Print ``line``, put the run into Failed with ``reason`` (what the UI shows) unless it ended; 1."""
    from prefect.exceptions import Abort
    from prefect.states import Failed
    from prefect.utilities.engine import propose_state_sync

    print(line, file=sys.stderr)
    with contextlib.suppress(Abort):  # the run ended already
        propose_state_sync(client, Failed(message=prefix + reason), flow_run_id=flow_run_id)
    return 1


def main(argv: list[str] | None = None) -> int:
    """The locked pool's command: check the flow run named by ``PREFECT__FLOW_RUN_ID``, then run Prefect's
    engine in this process; a refused run goes to Failed and nothing of it runs."""
    import runpy
    from uuid import UUID

    parser = argparse.ArgumentParser(prog=f"python -I -m {GUARD_MODULE}")
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--prefect-file", default="prefect.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--allow-env", action="append", default=[])
    parser.add_argument("--home-root", type=Path)
    args = parser.parse_args(argv)
    guard = Guard(args.repo, args.prefect_file, dict(v.split("=", 1) for v in args.set),
                  tuple(args.allow_env) or ALLOWED_RUN_ENV, args.home_root)
    from prefect.client.orchestration import get_client

    flow_run_id = UUID(os.environ["PREFECT__FLOW_RUN_ID"])
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        deployment = client.read_deployment(flow_run.deployment_id) if flow_run.deployment_id else None
        reason = guard.check(flow_run.model_dump(mode="json"),
                             deployment.model_dump(mode="json") if deployment else None)
        if reason is not None:
            return _fail(client, flow_run_id, reason,
                         f"trainflow worker guard refused flow run {flow_run_id}: {reason}")
        # The committed pull steps and entrypoint, from the file: a deployment changed after the check changes nothing.
        want = guard.committed[deployment.name]
        try:
            _pull(want["pull_steps"], deployment, flow_run)
        except Exception as exc:  # the step's own error, as the engine would have reported it
            reason = f"pull step failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            return _fail(client, flow_run_id, reason, f"trainflow worker guard: flow run {flow_run_id}: {reason}", "")
    os.environ["PREFECT__FLOW_ENTRYPOINT"] = want["entrypoint"]
    sys.argv = ["prefect.engine"]
    runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
