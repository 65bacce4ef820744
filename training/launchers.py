"""The launchers a launch plan (``training.plan``) runs on, chosen by name (``--launcher``):

- ``local``: torchrun on this host (``training.launcher``), the default;
- ``slurm``: one batch job whose ``srun`` starts torchrun on every node (``training.slurm``);
- ``kubernetes``: an indexed Job or a Kubeflow TrainJob through the official client.

Each has the same two verbs: ``start`` returns a job, whose ``finish()`` returns the training result
(``result.json`` plus ``wall_s``, ``out_dir`` and, for a cluster, ``launcher``: where it ran) or
raises TrainingFailedError / PreemptedError, as the local launcher does.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from core.errors import ConfigError
from training.launcher import Hooks
from training.plan import LaunchPlan

__all__ = ["Hooks", "Labels", "launcher_for"]
NAMES = ("local", "slurm", "kubernetes")


class StartedJob(Protocol):
    def finish(self, at_result: bool = False) -> dict: ...


@dataclass(frozen=True)
class Labels:
    """What a cluster job carries to name the run it belongs to (Slurm's comment, pod labels)."""

    flow_run_id: str = ""
    mlflow_run_id: str = ""

    def comment(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (("flow-run", self.flow_run_id), ("mlflow-run", self.mlflow_run_id))
                        if v)


class Launcher(Protocol):
    def start(self, plan: LaunchPlan, out_dir: Path, root: Path, data_md5: str, env: dict[str, str] | None = None,
              lock_fd: int | None = None, labels: Labels = Labels(), hooks: Hooks | None = None) -> StartedJob: ...


class Local:
    """torchrun on this host; the job dies with the calling thread's process."""

    def start(self, plan, out_dir, root, data_md5, env=None, lock_fd=None, labels=Labels(), hooks=None):
        from training.launcher import launch

        return launch(plan, out_dir, root, data_md5, env, lock_fd=lock_fd)


class Slurm:
    """One ``sbatch`` job of ``plan.nnodes`` nodes, followed with ``scontrol`` and cancelled with the run."""

    def start(self, plan, out_dir, root, data_md5, env=None, lock_fd=None, labels=Labels(), hooks=None):
        from training import slurm
        from training.launcher import check_plan_resumable

        check_plan_resumable(plan, out_dir, data_md5)
        return slurm.start(plan, out_dir, root, data_md5, env, labels.comment(), hooks or Hooks())


class Kubernetes:
    """The plan as the config's ``launcher.kubernetes`` job (``training.kube``): checked and rendered
    here; ``finish`` submits it, follows it and maps its ending as Slurm's (``KubeJob``)."""

    def start(self, plan, out_dir, root, data_md5, env=None, lock_fd=None, labels=Labels(), hooks=None):
        from core.manifest import git_state
        from core.paths import trainflow_home, tracking_uri
        from training import kube
        from training.launcher import check_plan_resumable

        cfg = plan.cfg
        out_name = check_kube_shared_dir(cfg, Path(out_dir))
        check_plan_resumable(plan, out_dir, data_md5)
        commit, dirty = git_state(Path(root))
        hooks = hooks or Hooks()
        if dirty:
            hooks.log(f"kubernetes: the pods check out commit {commit}; this checkout's uncommitted changes "
                      "are not in it")
        name = f"tf-{re.sub(r'[^a-z0-9-]', '-', cfg.name.lower())[:36].strip('-')}-{secrets.token_hex(3)}"
        render = dict(git_ref=commit if commit != "unknown" else "", data_md5=data_md5,
                      mlflow_uri=tracking_uri(trainflow_home(Path(root))), mlflow_run_id=None, out_name=out_name,
                      env=env or {},
                      labels={k: v for k, v in (("trainflow/flow-run", labels.flow_run_id),
                                                ("trainflow/mlflow-run", labels.mlflow_run_id)) if v})
        kube.dry_run(plan, name=name, **render)  # refusals (settings, the embedded store) before anything exists
        return KubeJob(plan, Path(out_dir), name, render, hooks)


def check_kube_shared_dir(cfg, out_dir: Path) -> str:
    """The training folder's path below ``launcher.kubernetes.shared_dir`` (the pods' /shared/<it>);
    ConfigError in one line when the key is missing, the folder is not on this host, or ``out_dir``
    is not inside it."""
    shared = cfg.launcher.kubernetes.shared_dir
    if not shared:
        raise ConfigError("launcher.kubernetes.shared_dir: required for --launcher kubernetes: where this host "
                          f"mounts the volume {cfg.launcher.kubernetes.shared_pvc} that the pods mount at /shared")
    if not Path(shared).is_dir():
        raise ConfigError(f"launcher.kubernetes.shared_dir: {shared} does not exist here; mount the volume "
                          f"{cfg.launcher.kubernetes.shared_pvc} there")
    if not out_dir.is_relative_to(shared):
        raise ConfigError(f"launcher.kubernetes.shared_dir: the training folder {out_dir} is not inside {shared}; "
                          "set TRAINFLOW_HOME to a folder on that volume")
    below = out_dir.relative_to(shared).as_posix()
    if not below or below == "." or not re.match(r"^[A-Za-z0-9._/+-]+$", below):
        raise ConfigError(f"launcher.kubernetes.shared_dir: the training folder {out_dir} must be a folder below "
                          f"{shared} named with letters, digits and ._/+- only")
    return below


def kube_job_id(handle) -> str:
    """The id a Kubernetes job is recorded under (registry.orphans): ``<flavour>.<namespace>.<name>``."""
    return f"{handle.flavour}.{handle.namespace}.{handle.name}"


def cancel_kube_job(job_id: str) -> None:
    """Delete the Kubernetes job recorded as ``job_id`` (``kube_job_id``) on the kubeconfig's cluster."""
    from training import kube

    flavour, namespace, name = job_id.split(".")
    kube.cancel(kube.Handle(name, namespace, flavour), kube.Kube.connect())


@dataclass
class KubeJob:
    """A Kubernetes training job of one run, as ``slurm.SlurmJob``: ``finish`` submits it (``kube.run``:
    resubmitted after PREEMPTED / TIMEOUT up to ``training.max_restarts``, each resubmission in the
    goodput ledger), logs its states and pod 0's lines, deletes it when the run stops (SIGTERM,
    Ctrl-C, the task's cancellation) and reads the result the pods wrote into the training folder on
    the shared volume."""

    plan: LaunchPlan
    out: Path
    name: str
    render: dict
    hooks: Hooks
    kube: object = None  # a kube.Kube; None: the kubeconfig's (or the pod's service account) cluster
    started_at: float = field(default_factory=time.perf_counter)

    def finish(self, at_result: bool = False) -> dict:
        from core.errors import PreemptedError, TrainingFailedError
        from training import kube, preemption
        from training.goodput import LEDGER_FILE, Ledger
        from training.launcher import FATAL_FILE

        self.out.mkdir(parents=True, exist_ok=True)
        for stale in ("result.json", FATAL_FILE):  # an earlier job's must not pass for this one's
            (self.out / stale).unlink(missing_ok=True)
        client = self.kube or kube.Kube.connect()

        def sleep(seconds: float) -> None:
            if preemption.REQUESTED.is_set():  # kube.run deletes the job on the way out
                preemption.REQUESTED.clear()
                raise PreemptedError(f"stopped: Kubernetes job {self.name} deleted with the run; the next run "
                                     "resumes from its last checkpoint")
            preemption.REQUESTED.wait(seconds)

        endings = []  # each job's; a job submitted after one resumes from its checkpoint

        def on_event(event) -> None:
            if event.kind == "ending":
                endings.append(event.ending.state)
            else:
                self.hooks.log(f"[{self.name}] {event.text}" if event.kind == "log" else f"kubernetes: {event.text}")

        def on_submitted(handle) -> None:
            if endings:
                Ledger(self.out / LEDGER_FILE).resubmitted(handle.name, endings[-1])
            self.hooks.submitted(kube_job_id(handle))

        with preemption.handling():  # SIGTERM of this process: delete the job (sleep)
            ending, names = kube.run(self.plan, client, name=self.name, on_event=on_event, sleep=sleep,
                                     on_submitted=on_submitted,
                                     on_ended=lambda h: self.hooks.ended(kube_job_id(h)), **self.render)
        self.hooks.log(f"kubernetes: {ending.message}")
        job = {"name": "kubernetes", "job_id": names[-1], "job_ids": names, "nodes": list(ending.nodes),
               "state": ending.state, "requeues": len(names) - 1}
        if ending.state == "COMPLETED":
            try:
                result = json.loads((self.out / "result.json").read_text())
            except (OSError, ValueError):
                result = None
            if not isinstance(result, dict) or result.get("status") != "completed":
                raise TrainingFailedError(f"Kubernetes job {names[-1]} completed but wrote no completed "
                                          f"{self.out / 'result.json'} (is {self.out} the volume the pods mount?)")
            return {**result, "wall_s": time.perf_counter() - self.started_at, "out_dir": str(self.out),
                    "launcher": job}
        if ending.state == "CANCELLED":
            raise TrainingFailedError(ending.message)
        if ending.resume:
            said = ending.message.removesuffix("; resuming from the last checkpoint")
            raise PreemptedError(f"{said}; no restart left (training.max_restarts="
                                 f"{self.plan.cfg.training.max_restarts}): rerun to resume from its checkpoint")
        raise TrainingFailedError(ending.message, rank=ending.rank, traceback=ending.log_tail)


def launcher_for(name: str) -> Launcher:
    """The launcher called ``name``; ConfigError naming ``--launcher`` for any other."""
    launchers = {"local": Local, "slurm": Slurm, "kubernetes": Kubernetes}
    if name not in launchers:
        raise ConfigError(f"--launcher: one of {', '.join(NAMES)}, got {name!r}")
    return launchers[name]()
