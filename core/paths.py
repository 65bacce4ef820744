"""Where things live: the project root and the local state folder (TRAINFLOW_HOME)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.errors import ConfigError


def project_root(start: str | Path | None = None) -> Path:
    """The DVC repository holding ``start`` (a config file or folder), else the cwd: the root a
    config's dataset paths are relative to."""
    here = Path(start or Path.cwd()).resolve()
    here = here.parent if here.is_file() else here
    return next((c for c in (here, *here.parents) if (c / ".dvc").is_dir()), Path.cwd().resolve())


def python_path_with(root: str | Path, current: str | None = None) -> str:
    """``PYTHONPATH`` for a child process: ``root`` first, then ``current``'s entries other than
    ``root`` (empty entries, which mean the cwd, dropped)."""
    first = str(Path(root).resolve())
    rest = [p for p in (current or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def importable_root(root: str | Path) -> str:
    """Put the project root first on ``sys.path`` (once: a ``model.factory`` or a user's task lives
    there, off the path of the ``trainflow`` script and of a Prefect worker) and return this
    process's ``PYTHONPATH`` with it first, for a subprocess's ``env=``."""
    first = str(Path(root).resolve())
    if first not in sys.path:
        sys.path.insert(0, first)
    return python_path_with(first, os.environ.get("PYTHONPATH"))


def trainflow_home(root: Path | None = None) -> Path:
    """State folder for MLflow's and Prefect's databases, artifacts and run outputs: ``TRAINFLOW_HOME``,
    else ``<project root>/.trainflow``."""
    env = os.environ.get("TRAINFLOW_HOME")
    return Path(env).resolve() if env else (root or project_root()) / ".trainflow"


def under_home(home: Path, *parts: str | Path) -> Path:
    """``home / parts``; ConfigError naming the path unless it stays inside ``home`` (the parts come
    from a config or a record: never a write or an ``rmtree`` elsewhere). The check is on the
    normalised path, not on symlinks: a folder the user links elsewhere stays usable."""
    base = Path(os.path.abspath(home))
    path = Path(os.path.normpath(base.joinpath(*parts)))
    if path != base and base not in path.parents:
        shown = "/".join(str(p) for p in parts)
        raise ConfigError(f"{shown}: resolves to {path}, outside TRAINFLOW_HOME ({base})")
    return path


def default_tracking_uri(home: Path) -> str:
    # Four slashes: sqlite wants an absolute path after "sqlite:///".
    return f"sqlite:///{(home / 'mlflow.db').resolve()}"


def tracking_uri(home: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(home)
