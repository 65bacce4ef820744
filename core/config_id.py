"""Config-id compatibility: which keys the config id and the resume id hash.

The config id is the sha256 of a loaded config's canonical JSON. A key added to the schema after
configs were first hashed (a later key) is left out while it holds its default, so a config that
does not use it keeps the id it always had: champions, training folders and checkpoints are named by
these ids (``tests/configs/config_ids.json`` pins them). Every key a task's options model adds
(``core.config.register_options``) is a later key too.
"""

from __future__ import annotations

import copy
from typing import Any

from core.hashing import sha256_json

# Sections that say when to train, not what to train: left out of the config id, so tuning them
# neither makes the champion look stale nor orphans a resumable training folder.
# ``launcher`` says where the job runs, not what it learns.
NOT_IN_CONFIG_ID = frozenset({"retrain", "launcher"})
# training.* keys that say how a run is laid out over processes and operated, not what it learns:
# left out of ``resume_id``, so a checkpoint resumes on another world size or strategy.
# ``loader`` is not one: a streamed source's order (kind, shuffle window, held-out rows) differs from
# the in-memory one, and a cursor means nothing in another order.
LAYOUT_KEYS = frozenset({
    "strategy", "parallel", "cpu_workers", "threads_per_worker", "backend", "max_restarts",
    "collective_timeout_s", "timeout_s", "preempt_grace_s", "preempt_check_steps", "checkpoint_every_epochs",
    "checkpoint_every_steps", "keep_checkpoints", "checkpoints", "metrics", "log_every_steps",
    "straggler_ratio", "peak_tflops", "checkpoint_every", "rendezvous", "compile", "checkpoint_budget",
})

# (section, key) of core/config.py's shared sections added after configs were first hashed: left
# out of the config id while at their default. The tasks' own keys join through ``add_later_key``.
ID_LATER_KEYS = (
    ("model", "factory"), ("model", "kwargs"),
    ("training", "parallel"), ("training", "checkpoint_every"), ("training", "rendezvous"),
    ("training", "loader", "stream_above_mb"), ("training", "loader", "shuffle_row_groups"),
    ("training", "loader", "val_rows"), ("training", "loader", "csv_parquet_above_mb"),
    ("training", "compile"),
    ("gates", "min_improvement"), ("gates", "max_gap_to_gbdt"),
    ("training", "early_stopping", "restore_best"),
    ("primary_metric",), ("training", "class_weight"), ("gates", "allow_single_class"),
    ("gates", "max_gap_to_baseline"), ("training", "checkpoint_budget"),
)

# Key path -> its default as a config dumped to JSON holds it: every later key, shared or a task's.
_LATER: dict[tuple[str, ...], Any] = {}


def add_later_key(path: tuple[str, ...], default: Any) -> None:
    """Leave the key at ``path`` out of the config id while it equals ``default`` (JSON form)."""
    _LATER[tuple(path)] = default


def config_id_of(dumped: dict) -> str:
    """The config id of a config dumped to JSON (e.g. a run's ``config.json``), of any age: later
    keys are left out while they hold their default, so a config that does not use them keeps the
    id it always had; ``NOT_IN_CONFIG_ID`` sections are always left out."""
    data = {k: copy.deepcopy(v) for k, v in dumped.items() if k not in NOT_IN_CONFIG_ID}
    for (*sections, key), default in _LATER.items():  # (section, key) or (section, subsection, key)
        part = data
        for name in sections:
            part = part.get(name) if isinstance(part, dict) else None
        if isinstance(part, dict) and key in part and part[key] == default:
            del part[key]
    return sha256_json(data)


def resume_id_of(dumped: dict) -> str:
    """The config id without ``LAYOUT_KEYS``: what a checkpoint must match to be resumed without
    --force-resume (a checkpoint resumes on another world size or strategy; what is learned may
    not change)."""
    training = {k: v for k, v in dumped["training"].items() if k not in LAYOUT_KEYS}
    return config_id_of({**dumped, "training": training})
