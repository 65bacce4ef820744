"""Older versions of the code and the data, back from git and DVC (for the drift check and
``reproduce``). DVC is imported inside the functions; git and dvc run as subprocesses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from core.errors import DataUnavailableError, TrainflowError


class SourceUnavailableError(TrainflowError):
    """The git commit a model was trained from is not in this repository."""


# Values read back from a model version's tags or a run's manifest: anyone who can write to the
# tracking server wrote them, so they are checked before git, DVC or a path join sees them.
_GIT_SHA = re.compile(r"^[0-9a-f]{7,64}$")
_DVC_MD5 = re.compile(r"^[0-9a-f]{32}(\.dir)?$")
_DVC = (sys.executable, "-m", "dvc")


def is_git_sha(value: object) -> bool:
    """A hex commit id (7 to 64 lowercase hex digits): never an option, a range or a path."""
    return isinstance(value, str) and bool(_GIT_SHA.match(value))


def check_md5(md5: object, key: str = "data_md5") -> str:
    """``md5`` if it is a DVC md5 (32 hex digits, ``.dir`` for a folder), else DataUnavailableError
    naming ``key`` (the cache path is built from it)."""
    if not isinstance(md5, str) or not _DVC_MD5.match(md5):
        raise DataUnavailableError(f"{key}: must be a DVC md5 (32 hex digits, optionally .dir), got {md5!r}")
    return md5


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def cache_dir(root: Path) -> Path:
    """The DVC cache folder of the repository at ``root`` (``cache.dir``, default ``.dvc/cache``)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        # DVC 3 keeps md5 objects under <cache.dir>/files/md5.
        return Path(repo.cache.local.path).parents[1]


def _cached_object(root: Path, md5: str) -> bytes | None:
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        path = Path(repo.cache.local.oid_to_path(md5))
    return path.read_bytes() if path.is_file() else None


def read_tracked_file(root: Path, md5: str, relpath: str = "", rev: str | None = None,
                      dvc_file: str | None = None, path_in_repo: str | None = None) -> bytes:
    """The bytes of ``relpath`` inside the DVC output ``md5`` (``relpath`` empty for a single-file
    output), from the local cache, else from the remote when ``rev`` (a commit whose ``dvc_file``
    records ``md5``) and ``path_in_repo`` are given. Raises DataUnavailableError when neither has it."""
    root = Path(root)
    check_md5(md5)
    where = [f"the DVC cache of {root}"]
    obj = _cached_object(root, md5)
    if obj is not None and md5.endswith(".dir"):
        entries = {e["relpath"]: e["md5"] for e in json.loads(obj)}
        if relpath not in entries:
            raise DataUnavailableError(f"data version {md5} has no file {relpath!r} "
                                       f"(it holds {', '.join(sorted(entries)[:5])})")
        obj = _cached_object(root, check_md5(entries[relpath], f"{md5}/{relpath}"))
    if obj is not None:
        return obj
    if rev and dvc_file and path_in_repo and not is_git_sha(rev):
        where.append(f"the DVC remote (not tried: data_rev must be a hex git commit sha, got {rev!r})")
    elif rev and dvc_file and path_in_repo:
        shown = _run(["git", "show", f"{rev}:{dvc_file}"], root)
        recorded = None
        try:
            recorded = yaml.safe_load(shown.stdout)["outs"][0]["md5"] if shown.returncode == 0 else None
        except (yaml.YAMLError, KeyError, IndexError, TypeError):
            pass
        if recorded == md5:
            import dvc.api

            try:
                return dvc.api.read(path_in_repo, repo=str(root), rev=rev, mode="rb")
            except Exception as exc:  # noqa: BLE001 - DVC's errors are many; the message says enough
                where.append(f"the DVC remote (at git {rev[:12]}: {type(exc).__name__}: {exc})")
        else:
            where.append(f"the DVC remote (not tried: {dvc_file} at git {rev[:12]} records {recorded}, not {md5})")
    raise DataUnavailableError(f"data version {md5} ({relpath or 'file'}) is not available: looked in "
                               + " and ".join(where)
                               + "; `dvc push` after each `dvc add` keeps every version fetchable")


def commit_exists(root: Path, sha: str) -> bool:
    return _run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], root, timeout=30).returncode == 0


def checkout_commit(root: Path, sha: str, dest: Path) -> Path:
    """A clone of ``root`` at commit ``sha`` in ``dest`` (shares ``root``'s objects; ``root`` is
    not modified). Raises SourceUnavailableError when ``sha`` is not a commit of ``root``."""
    root, dest = Path(root), Path(dest)
    if _run(["git", "rev-parse", "--git-dir"], root, timeout=30).returncode != 0:
        raise SourceUnavailableError(f"{root} is not a git repository: cannot restore the code at {sha}")
    if sha != "unknown" and not is_git_sha(sha):
        raise SourceUnavailableError(f"git_sha: must be a hex git commit sha, got {sha!r}")
    if not is_git_sha(sha) or not commit_exists(root, sha):
        raise SourceUnavailableError(
            f"git commit {sha} is not in {root}: the code that trained this model is unavailable "
            "(fetch the branch that holds it, or run reproduce in the repository that trained it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    for cmd, cwd in ((["git", "clone", "--quiet", "--shared", "--no-checkout", str(root), str(dest)], root),
                     (["git", "checkout", "--quiet", "--detach", sha], dest)):
        out = _run(cmd, cwd)
        if out.returncode != 0:
            raise SourceUnavailableError(f"cannot check out {sha}: {' '.join(cmd[:3])}: {out.stderr.strip()}")
    return dest


def restore_data(checkout: Path, dvc_file: str, md5: str, cache: Path) -> list[str]:
    """Check the data version ``md5`` out into ``checkout`` from the DVC cache ``cache`` or the
    checkout's DVC remote. Returns warnings (``dvc_file`` repointed at ``md5`` when the commit
    records another: an uncommitted ``dvc add``); raises DataUnavailableError."""
    check_md5(md5)
    warnings: list[str] = []
    path = Path(checkout) / dvc_file
    try:
        meta = yaml.safe_load(path.read_text())
        out = meta["outs"][0]
    except (OSError, yaml.YAMLError, KeyError, IndexError, TypeError):
        raise DataUnavailableError(f"{dvc_file} is missing or unreadable at the recorded commit") from None
    if out.get("md5") != md5:
        warnings.append(f"{dvc_file} at the recorded commit names data {out.get('md5')}, the model was trained "
                        f"on {md5} (an uncommitted `dvc add`); restoring {md5}")
        out["md5"] = md5
        for stale in ("size", "nfiles"):
            out.pop(stale, None)
        path.write_text(yaml.safe_dump(meta, sort_keys=False))
    config = _run([*_DVC, "config", "--local", "cache.dir", str(Path(cache).resolve())], checkout, timeout=60)
    if config.returncode != 0:
        raise DataUnavailableError(f"cannot point the checkout at the DVC cache {cache}: {config.stderr.strip()}")
    done = _run([*_DVC, "checkout", "-q", dvc_file], checkout)
    if done.returncode != 0:
        done = _run([*_DVC, "pull", "-q", dvc_file], checkout)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise DataUnavailableError(
            f"data version {md5} ({dvc_file}) is in neither the DVC cache {cache} nor the checkout's DVC remote: "
            + (detail[-1] if detail else f"dvc exited {done.returncode}"))
    return warnings


# Paths whose changes do not change what a training run computes: data versions (compared by
# md5), configs (compared by config id), docs and tests.
NOT_CODE = ("*.dvc", ".dvc/*", "dvc-store/*", "configs/*", "*.md", "tests/*", "benchmarks/*", ".dvcignore",
            ".gitignore")


def code_changes(root: Path, since: str | None) -> list[str] | None:
    """Code files changed from commit ``since`` to the workspace (committed or not), leaving out
    ``NOT_CODE`` (a git sha alone would call every data commit a code change). None when ``since``
    is unknown or not a commit of ``root``."""
    import fnmatch

    root = Path(root)
    if not is_git_sha(since) or not commit_exists(root, since):
        return None
    changed: set[str] = set()
    for cmd in (["git", "diff", "--name-only", since, "HEAD"], ["git", "diff", "--name-only", "HEAD"]):
        out = _run(cmd, root, timeout=60)
        if out.returncode != 0:
            return None
        changed.update(line for line in out.stdout.splitlines() if line)
    return sorted(p for p in changed if not any(fnmatch.fnmatch(p, pat) for pat in NOT_CODE))
