"""``trainflow run`` starts its torchrun job early, held, while the flow's earlier stages run.

Saves the job's start-up (~6 s here) from the run's wall time. A torchrun job spends seconds
before its first step: the agent and every worker import torch, load the data and join the
process group. ``trainflow run`` knows the job it will launch as soon as it has read the
config (the training folder is chosen from the config, the DVC data version and the world
size alone), so ``Prelaunch.start`` starts it *held* (``training.held``) right after the
config is checked: the workers start up while Prefect's API server boots, the flow resolves
and the data is validated, then wait.

The CLI hands the ``Prelaunch`` to the flow through ``flows.params.from_shell``. At ``train``
the flow takes the held job when it is the job it would launch itself (the same resolved
config, data version, world size and project) and lets it go (its metrics file is relayed to
the run's MLflow run meanwhile, ``registry/relay.py``). Otherwise (other inputs, or the flow
never reaches ``train``: bad data, a bad config, an error, SIGTERM) it is aborted and its
workers exit before their first step, so **nothing is trained before validation passes**, and
nothing is written but the job's ``config.yaml`` / ``job.json``. The held job dies with the
CLI (``training.agent``; the workers also check that it is alive while they wait).

Only ``trainflow run`` holds a job (not ``retrain``, whose first question is whether to
train at all, and not deployments, whose flow runs in a Prefect worker). It is skipped
when the world is not known without measuring (``cpu_workers: auto`` with no saved sweep:
the flow's resolve probes) and with ``TRAINFLOW_PRELAUNCH=0``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from core.config import PipelineConfig
from training.launcher import SCORE_ENV
from training.sink import RUN_ID_ENV

OPT_OUT = "TRAINFLOW_PRELAUNCH"
# The environment every pipeline job gets: no MLflow run id, so rank 0 only writes its
# metrics file and the pipeline relays it (registry/relay.py); empty rather than absent, so a
# run id inherited from the caller's environment cannot switch direct logging back on.
# And rank 0 scores the exported program on the test split where it was made (torch is
# loaded there already), so the pipeline process never imports torch for a classifier.
JOB_ENV = {RUN_ID_ENV: "", SCORE_ENV: "1"}
log = logging.getLogger("trainflow.prelaunch")


@dataclass
class TrainFolder:
    """A training folder a run holds (its ``flock``, ``training.slots``) and, when ``trainflow run``
    started the job early, the held job in it (``training.held.HeldJob``)."""

    folder: Path
    lock_fd: int | None
    held: object | None = None  # training.held.HeldJob

    def release(self) -> None:
        """Close this process's copy of the lock (a job started in the folder keeps its own)."""
        from core.locks import release

        fd, self.lock_fd = self.lock_fd, None
        if fd is not None:
            release(fd)

    def abort(self, reason: str) -> None:
        try:
            if self.held is not None:
                self.held.abort(reason)
        finally:
            self.release()


def job_key(cfg: PipelineConfig, data_md5: str, nproc: int, root: Path) -> tuple:
    """What makes two launches the same job: the resolved config, data version, world, project."""
    return (cfg.to_yaml(), data_md5, int(nproc), str(Path(root).resolve()))


class Prelaunch:
    """The job ``trainflow run`` started held for its inputs, until the flow takes it or it is aborted.

    The CLI makes one (``start``) and hands it to the flow through ``flows.params.from_shell``;
    the flow ``take``s it at ``train``; the CLI ``abort``s it when the flow ends (a no-op once taken).
    """

    def __init__(self, key: tuple, slot: TrainFolder):
        self.key = key
        self.slot: TrainFolder | None = slot  # until taken or aborted

    @classmethod
    def start(cls, cfg_path: Path, overrides: list[str], nproc: int | None) -> Prelaunch | None:
        """Start the job ``trainflow run`` would launch for these inputs, held; None when skipped.

        Never raises for a reason the flow reports better itself (a bad config, missing data):
        those skip the early start and the flow fails as it always did.
        """
        if os.environ.get(OPT_OUT, "").strip().lower() in ("0", "false", "no", "off"):
            return None
        from core.config import load_config
        from core.manifest import read_dvc_file
        from core.paths import project_root, trainflow_home
        from training.advisor import load_sweep, resolve_for_launch
        from training.held import start_held
        from training.launcher import default_nproc, make_spec
        from training.slots import claim_train_dir

        try:
            root = project_root(cfg_path)
            home = trainflow_home(root)
            cfg = load_config(cfg_path, overrides)
            if cfg.training.cpu_workers == "auto" and not nproc and load_sweep(home, cfg) is None:
                return None  # the flow probes the layouts first: the world is not known yet
            cfg, _ = resolve_for_launch(cfg, home, nproc=nproc)  # no root: never probes here
            n = nproc or default_nproc(cfg)
            md5 = read_dvc_file(root, cfg.dataset.dvc_file).md5
            slot = TrainFolder(*claim_train_dir(home, cfg.name, cfg.config_id(), md5, n, log))
        except Exception as exc:  # noqa: BLE001 - the flow's resolve names it properly
            log.debug("no early launch: %s", exc)
            return None
        try:
            slot.held = start_held(make_spec(cfg, slot.folder, root, md5, JOB_ENV, n), lock_fd=slot.lock_fd)
        except BaseException as exc:
            slot.release()
            if not isinstance(exc, Exception):
                raise
            log.debug("no early launch: %s", exc)  # e.g. a world the strategy can't use: resolve/train say so
            return None
        return cls(job_key(cfg, md5, n, root), slot)

    def take(self, key: tuple) -> TrainFolder | None:
        """The held job's folder if it is the job with ``key`` (``job_key``); else it is aborted. Once."""
        slot, self.slot = self.slot, None
        if slot is None:
            return None
        if key != self.key or slot.held.job.proc.poll() is not None:
            slot.abort("the flow resolved other inputs than the early launch")
            return None
        return slot

    def abort(self, reason: str) -> None:
        """Abort the held job unless the flow took it (the flow ended without training, or the CLI exits)."""
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.abort(reason)
