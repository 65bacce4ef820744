"""Pure helpers that shape params, metrics and tags to fit MLflow's limits.

No MLflow import: the limits are copied from ``mlflow.utils.validation`` and an integration test
checks that they still match.
"""

from __future__ import annotations

import hashlib
import json
import numbers
import re
from collections.abc import Mapping
from typing import Any

MAX_KEY_LENGTH = 250  # MAX_ENTITY_KEY_LENGTH, MAX_MODEL_REGISTRY_TAG_KEY_LENGTH
MAX_PARAM_VALUE_LENGTH = 6000  # MAX_PARAM_VAL_LENGTH
MAX_TAG_VALUE_LENGTH = 8000  # MAX_TAG_VAL_LENGTH (run tags)
MAX_MODEL_TAG_VALUE_LENGTH = 100_000  # MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000

TRUNCATION_MARK = "...[truncated]"
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")

# MLflow (non-Windows) accepts alphanumerics, _, -, ., space, colon and slash in names.
_BAD_KEY_CHARS = re.compile(r"[^\w.\- :/]")


def truncate(value: str, limit: int) -> str:
    """``value`` cut to ``limit`` characters, ending in a visible mark when cut."""
    if len(value) <= limit:
        return value
    return (value[:max(limit - len(TRUNCATION_MARK), 0)] + TRUNCATION_MARK)[:limit]


def clean_key(key: Any, limit: int = MAX_KEY_LENGTH) -> str:
    """A key MLflow accepts: bad characters become ``_``, slashes neither doubled nor at either end
    (MLflow wants normalised paths); a key too long ends in ``~<8 hex of the full key's sha256>``."""
    text = re.sub(r"/{2,}", "/", _BAD_KEY_CHARS.sub("_", str(key))).strip("/")
    # "a/./b" or "a/../b" would not normalise to itself either.
    text = "/".join("_" if part in (".", "..") else part for part in text.split("/")) or "_"
    if len(text) > limit:
        text = text[: limit - 9] + "~" + hashlib.sha256(str(key).encode()).hexdigest()[:8]
    return text


def _param_text(value: Any) -> str:
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
        try:
            return json.dumps(items, separators=(",", ":"), default=str)
        except (TypeError, ValueError):
            return str(items)
    return value if isinstance(value, str) else str(value)


def flatten(obj: Mapping[str, Any], sep: str = ".", prefix: str = "") -> dict[str, Any]:
    """Nested mappings flattened to ``{"a.b.c": leaf}``; other values are leaves."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, sep, name))
        else:
            out[name] = value
    return out


def flatten_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Flat dotted keys, string values within the limits; lists become compact JSON, ``{}`` stays ``{}``."""
    return {clean_key(k): truncate("{}" if isinstance(v, Mapping) else _param_text(v), MAX_PARAM_VALUE_LENGTH)
            for k, v in flatten(params).items()}


def clean_tags(tags: Mapping[str, Any], value_limit: int = MAX_TAG_VALUE_LENGTH) -> dict[str, str]:
    """Flat string tags within the key and value limits (``None`` becomes ``""``)."""
    return {clean_key(k): truncate("" if v is None else _param_text(v), value_limit) for k, v in tags.items()}


def metric_value(key: str, value: Any) -> float:
    """A metric value as a float; bools count as 0/1. Raises TypeError on anything else."""
    if isinstance(value, numbers.Real):  # bools and numpy scalars too
        return float(value)
    item = getattr(value, "item", None)  # 0-d arrays and tensors
    if callable(item) and getattr(value, "ndim", 1) == 0:
        return metric_value(key, item())
    raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}")


def flatten_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Flat dotted metric names to floats (NaN and inf pass through: MLflow stores them)."""
    return {clean_key(k): metric_value(k, v) for k, v in flatten(metrics).items()}


def chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def check_run_status(status: str) -> str:
    value = str(status).upper()
    if value not in RUN_STATUSES:
        raise ValueError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
    return value


def dataset_source(path: str, rev: str) -> str:
    """``dvc://<path>@<git rev>``: a file of a run's DVC data at the commit that recorded its ``.dvc`` file."""
    return f"dvc://{str(path).strip('/')}@{rev}"
