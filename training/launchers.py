"""The launchers a launch plan (``training.plan``) runs on, chosen by name (``--launcher``):

- ``local``: torchrun on this host (``training.launcher``), the default;
- ``slurm``: one batch job whose ``srun`` starts torchrun on every node (``training.slurm``);
- ``kubernetes``: an indexed Job or a Kubeflow TrainJob through the official client.

Each has the same two verbs: ``start`` returns a job, whose ``finish()`` returns the training result
(``result.json`` plus ``wall_s``, ``out_dir`` and, for a cluster, ``launcher``: where it ran) or
raises TrainingFailedError / PreemptedError, as the local launcher does.
"""

from __future__ import annotations

from dataclasses import dataclass
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
        from training.launcher import _check_resumable
        from training.layouts import layout_for

        cfg = plan.cfg
        _check_resumable(out_dir, cfg.config_id(), data_md5, False,
                         layout_for(cfg.training.strategy, plan.world.size, cfg.training.parallel), cfg.resume_id())
        return slurm.start(plan, out_dir, root, data_md5, env, labels.comment(), hooks or Hooks())


class Kubernetes:
    """The plan as a Kubernetes Job / TrainJob (its own module); not part of this build yet."""

    def start(self, plan, out_dir, root, data_md5, env=None, lock_fd=None, labels=Labels(), hooks=None):
        raise ConfigError("--launcher kubernetes: not available yet; `trainflow k8s-job` prints the Job to apply")


def launcher_for(name: str) -> Launcher:
    """The launcher called ``name``; ConfigError naming ``--launcher`` for any other."""
    launchers = {"local": Local, "slurm": Slurm, "kubernetes": Kubernetes}
    if name not in launchers:
        raise ConfigError(f"--launcher: one of {', '.join(NAMES)}, got {name!r}")
    return launchers[name]()
