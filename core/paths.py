"""Where things live: the project root and the local state folder (TRAINFLOW_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def project_root(start: str | Path | None = None) -> Path:
    """The DVC repository holding ``start`` (a config file or folder), else the cwd.

    Dataset paths in a config are relative to this root.
    """
    here = Path(start or Path.cwd()).resolve()
    if here.is_file():
        here = here.parent
    for candidate in (here, *here.parents):
        if (candidate / ".dvc").is_dir():
            return candidate
    return Path.cwd().resolve()


def trainflow_home(root: Path | None = None) -> Path:
    """State folder for MLflow's database, artifacts, Prefect's database and run outputs.

    ``TRAINFLOW_HOME`` wins; otherwise ``<project root>/.trainflow``.
    """
    env = os.environ.get("TRAINFLOW_HOME")
    return Path(env).resolve() if env else (root or project_root()) / ".trainflow"


def default_tracking_uri(home: Path) -> str:
    # Four slashes: sqlite wants an absolute path after "sqlite:///".
    return f"sqlite:///{(home / 'mlflow.db').resolve()}"


def tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(home)
