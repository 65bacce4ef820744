"""Config keys that name a file or folder, and the rule for their values from an override: a path
given with ``--set`` (or any override of a committed config) resolves inside the repository, symlinks
followed, or the config is refused with one line naming the key, before anything opens the path.
A committed config's own paths are the reviewer's; an override is typed at a shell or sent to a
run and may come from a script or a log, so nothing it names is read outside the repository.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import ConfigError

# Each key that names a path, and the key whose folder it is relative to (None: the repository root).
PATH_KEYS: dict[str, str | None] = {
    "dataset.path": None,
    "dataset.dvc_file": None,
    "dataset.expectations_file": None,
    "model.weights": None,
    "dataset.train_file": "dataset.path",
    "dataset.test_file": "dataset.path",
    "dataset.file": "dataset.path",
    "dataset.text.train_file": "dataset.path",
    "dataset.text.eval_file": "dataset.path",
    "dataset.images.train_dir": "dataset.path",
    "dataset.images.test_dir": "dataset.path",
    "dataset.images.manifest": "dataset.path",
}

_MISSING = object()


def _raw(data: Any, key: str) -> Any:
    """The value at dotted ``key`` of a config's YAML mapping, or _MISSING."""
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _loaded(cfg: Any, key: str) -> Any:
    """The value at dotted ``key`` of a loaded config (None under an absent section)."""
    for part in key.split("."):
        cfg = getattr(cfg, part, None)
        if cfg is None:
            return None
    return cfg


def check_override_paths(before: dict, after: dict, cfg: Any, root: Path) -> None:
    """ConfigError naming the first path key that an override set (``before``/``after``: the config's
    YAML without and with the overrides; ``cfg``: the loaded config) and that does not resolve inside
    ``root``. When ``dataset.path`` changed, the keys under it (and a ``dataset.dvc_file`` made from
    it) are checked as well."""
    root = Path(root).resolve()
    changed = {key for key in PATH_KEYS if _raw(before, key) != _raw(after, key)}
    for key, base_key in PATH_KEYS.items():
        value = _loaded(cfg, key)
        moved = "dataset.path" in changed and (base_key or _raw(after, key) is _MISSING)
        if value is None or not (key in changed or moved):
            continue
        base = root / _loaded(cfg, base_key) if base_key else root
        if not (base / str(value)).resolve().is_relative_to(root):
            raise ConfigError(f"{key}: {str(value)!r} resolves outside the repository {root}; a path set by an "
                              "override must stay inside it (commit a config that names the file instead)")
