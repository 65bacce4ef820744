"""Where things live: the project root and the local state folder (TRAINFLOW_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

from core.errors import ConfigError


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


def python_path_with(root: str | Path, current: str | None = None) -> str:
    """``PYTHONPATH`` for a child process: ``root`` first, then ``current``'s entries (pure).

    An entry equal to ``root`` is not repeated; empty entries (which mean the cwd) are dropped.
    """
    first = str(Path(root).resolve())
    rest = [p for p in (current or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def importable_root(root: str | Path) -> str:
    """Make the project root importable here and return the ``PYTHONPATH`` for children.

    A user's ``model.factory: mymodels.resmlp:make_resmlp`` or own task names a module in the
    repository root; the ``trainflow`` script's ``sys.path[0]`` is the venv's ``bin/``, a Prefect
    worker's is its own, so each entry point calls this once it knows the root. Side effect:
    ``root`` is put first on ``sys.path`` (once: a second call changes nothing). The value
    returned is this process's ``PYTHONPATH`` with ``root`` first, for ``env=`` of a subprocess;
    ``os.environ`` is not changed.
    """
    import sys

    first = str(Path(root).resolve())
    if first not in sys.path:
        sys.path.insert(0, first)
    return python_path_with(first, os.environ.get("PYTHONPATH"))


def trainflow_home(root: Path | None = None) -> Path:
    """State folder for MLflow's database, artifacts, Prefect's database and run outputs.

    ``TRAINFLOW_HOME`` wins; otherwise ``<project root>/.trainflow``.
    """
    env = os.environ.get("TRAINFLOW_HOME")
    return Path(env).resolve() if env else (root or project_root()) / ".trainflow"


def under_home(home: Path, *parts: str | Path) -> Path:
    """``home / parts``, refused unless it stays inside ``home`` (TRAINFLOW_HOME).

    Every folder the pipeline writes is built here from names that come from a config or a
    record (a pipeline name, a run id), so a ``..`` or an absolute part (``name: /tmp/x``) is a
    ConfigError naming the path, never a write or an ``rmtree`` elsewhere. The check is on the
    normalised path, not on symlinks: a folder the user links elsewhere on purpose stays usable.
    """
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
