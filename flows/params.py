"""What a pipeline run may be given, and by whom. Two channels, on purpose:

* ``PipelineParams``, the flow's one parameter (the Prefect UI form, every deployment's API): input from
  anyone who may trigger a run. It names a config file in ``configs/`` and may override only ``KNOBS``
  and promotion to manual.
* ``ShellInputs``, what the person at the shell gave ``trainflow run`` / ``retrain``: any config path and
  every ``--set`` but code keys. The CLI sets it in a context variable around its in-process flow call
  (``from_shell``), so no deployment form or API call reaches it.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.errors import ConfigError

# Keys that name code to run: they come only from a committed config file, never from a run's
# parameters or the shell's --set.
CODE_KEYS = ("task", "model.factory", "model.kwargs")

# A config file directly in configs/: a file name, never a path ("..", "/", absolute).
CONFIG_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\.ya?ml$"
DEFAULT_CONFIG = "digits.yaml"

# Deployment parameter -> the config key it overrides: nothing else of a config is a run's to change.
KNOBS = {
    "epochs": "training.epochs",
    "lr": "training.lr",
    "batch_size": "training.batch_size",
    "seed": "seed",
    "strategy": "training.strategy",
}


def code_override(items: list[str]) -> str | None:
    """The error line for the first override that names code to run (``CODE_KEYS``), else None."""
    for item in items:
        key = item.partition("=")[0].strip()
        if any(key == k or key.startswith(k + ".") for k in CODE_KEYS):
            return (f"{key}: names code to run, so it comes only from the committed config file, "
                    "not from an override")
    return None


class PipelineParams(BaseModel):
    """Inputs of one pipeline run from a deployment (the UI form, the API). Defaults run the
    bundled digits pipeline as committed."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    config: str = Field(DEFAULT_CONFIG, pattern=CONFIG_NAME,
                        description="A config file in the repository's configs/ folder, by file name (e.g. wine.yaml)")
    epochs: int | None = Field(None, gt=0, le=100_000, description="Override training.epochs")
    lr: float | None = Field(None, gt=0, le=10, description="Override training.lr (before scaling to the global batch)")
    batch_size: int | None = Field(None, gt=0, le=1_000_000, description="Override training.batch_size (per worker)")
    seed: int | None = Field(None, ge=0, le=2**32 - 1, description="Override seed")
    strategy: Literal["single", "ddp", "fsdp", "tp", "pp", "hybrid", "auto"] | None = Field(
        None, description="Override training.strategy")
    nproc_per_node: int | None = Field(None, gt=0, le=64,
                                       description="Workers per node (default: GPUs, else training.cpu_workers)")
    promotion: Literal["manual"] | None = Field(
        None, description="manual: register the version as @challenger only, never move @champion")
    launcher: Literal["local", "slurm", "kubernetes"] | None = Field(
        None, description="Where training runs: local (torchrun on the flow's host, the default), slurm or "
                          "kubernetes (the cluster settings come from the config's launcher section)")
    nnodes: int | None = Field(None, gt=0, le=1024, description="Nodes of a cluster launcher's job (default 1)")

    @model_validator(mode="before")
    @classmethod
    def _only_knobs(cls, data: Any) -> Any:
        # Say which key, and what may be set instead, before pydantic's generic "extra" error.
        if isinstance(data, dict):
            if extra := [k for k in data if k not in cls.model_fields]:
                raise ValueError(f"{extra[0]}: not a run parameter; a run chooses 'config' (a file in configs/) "
                                 f"and may set only {', '.join(k for k in cls.model_fields if k != 'config')}; "
                                 "everything else comes from the committed config")
        return data

    def overrides(self) -> list[str]:
        """The knobs that are set, as ``KEY.PATH=VALUE`` overrides of the config."""
        out = [f"{key}={getattr(self, name)}" for name, key in KNOBS.items() if getattr(self, name) is not None]
        if self.promotion:
            out.append(f"registry.promotion={self.promotion}")
        return out


class RetrainParams(PipelineParams):
    """Inputs of the ``retrain`` flow: a pipeline run, made only when the champion is stale."""

    force: bool = Field(False, description="Train even when data, config and code equal the champion's")


@dataclass(frozen=True)
class ShellInputs:
    """What the person at the shell gave the CLI: trusted, never a flow parameter."""

    config_path: Path
    overrides: tuple[str, ...] = ()
    nproc_per_node: int | None = None
    image: str | None = None
    image_digest: str | None = None
    launcher: str | None = None
    nnodes: int | None = None


class RunInputs(ShellInputs):
    """What one run uses: the config file, its overrides, the world and the image it records."""


_SHELL: ContextVar[ShellInputs | None] = ContextVar("trainflow_shell_inputs", default=None)


@contextmanager
def from_shell(shell: ShellInputs) -> Iterator[None]:
    """Within this block (the CLI's in-process flow call), runs take ``shell``'s inputs."""
    if problem := code_override(list(shell.overrides)):
        raise ConfigError(problem)
    token = _SHELL.set(shell)
    try:
        yield
    finally:
        _SHELL.reset(token)


def config_file(name: str, start: Path | None = None) -> Path:
    """``configs/<name>`` of the project around ``start`` (default: the cwd); ConfigError naming
    ``config`` unless it is a file name there that resolves inside ``configs/``."""
    from core.paths import project_root

    if not re.match(CONFIG_NAME, name):
        raise ConfigError(f"config: must be a file name in configs/ (e.g. {DEFAULT_CONFIG}), got {name!r}")
    folder = project_root(start) / "configs"
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()) or not path.is_file():
        raise ConfigError(f"config: {name!r} is not a config file in {folder}")
    return path


def run_inputs(params: PipelineParams) -> RunInputs:
    """The run's inputs: the shell's when the CLI runs the flow (its knobs come last), else the
    deployment's ``params`` only (a config in ``configs/`` of the project around the cwd)."""
    if (shell := _SHELL.get()) is not None:
        return RunInputs(Path(shell.config_path), (*shell.overrides, *params.overrides()),
                         params.nproc_per_node or shell.nproc_per_node, shell.image, shell.image_digest,
                         params.launcher or shell.launcher, params.nnodes or shell.nnodes)
    return RunInputs(config_file(params.config), tuple(params.overrides()), params.nproc_per_node, None, None,
                     params.launcher, params.nnodes)
