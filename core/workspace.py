"""The data a run reads is the data its ``.dvc`` files record: the workspace is compared with them
before anything is validated or trained, so the md5 in the manifest is the md5 of what trains.

The comparison is ``dvc status``'s (each output's workspace status), through DVC's own state
database: a file whose inode, size and mtime DVC has seen keeps its recorded hash, so an unchanged
folder is not read again. DVC is imported inside the function that asks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from core.errors import DataUnavailableError, WorkspaceChangedError

# What DVC's workspace status says of an output whose files are not the recorded ones. ("deleted":
# nothing there to read; the readers say `dvc pull` by the path they need.)
CHANGED = ("modified", "new")


def first_change(statuses: Iterable[tuple[str, str, dict]]) -> str | None:
    """The message for the first changed output in ``(dvc_file, path, {out: status})`` rows, else None."""
    for dvc_file, path, status in statuses:
        for state in status.values():
            if state in CHANGED:
                return (f"{path}: the workspace differs from {dvc_file} (dvc status: {state}), so the recorded "
                        f"data version is not the data that would train; record it with `dvc add {path}` and "
                        f"commit {dvc_file}, or restore the recorded data with `dvc checkout {dvc_file}`")
    return None


def workspace_statuses(root: Path, dvc_files: Iterable[str]) -> list[tuple[str, str, dict]]:
    """``(dvc_file, output path, {output: status})`` for each output of each tracked file, by DVC.

    Read-only, and without DVC's repository lock: concurrent runs of one checkout each ask, and
    the lock would make all but one of them wait or fail, for a read that needs no exclusion (the
    state database has its own).
    """
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    rows = []
    try:
        repo = Repo(str(root))
    except DvcException as exc:
        first = next(iter(dvc_files), "")
        raise DataUnavailableError(f"{first}: cannot compare the workspace with it: {root} is not a DVC "
                                   f"repository ({type(exc).__name__}); run `dvc init` and `dvc add` the data") from None
    with repo:
        for dvc_file in dvc_files:
            try:
                stage = repo.stage.load_one(str(Path(root) / dvc_file))
            except DvcException as exc:
                raise DataUnavailableError(f"{dvc_file}: DVC cannot read it ({type(exc).__name__})") from None
            for out in stage.outs:
                path = (Path(dvc_file).parent / out.def_path).as_posix()  # from the root, wherever the cwd is
                rows.append((dvc_file, path, out.workspace_status()))
    return rows


def check_tracked(root: Path, dvc_files: Iterable[str]) -> None:
    """Raise WorkspaceChangedError (one line: the path and both remedies) when the workspace of any
    of ``dvc_files`` (a dataset's, a pretrained model folder's) is not what the file records."""
    message = first_change(workspace_statuses(root, list(dvc_files)))
    if message:
        raise WorkspaceChangedError(message)
