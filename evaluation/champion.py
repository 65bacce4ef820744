"""The champion against the candidate: which of its scores count, and whether the candidate takes
``@champion``. The one place promotion is decided; no MLflow here (the caller hands in the
champion's tags and a way to load it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evaluation.gates import beats
from evaluation.recorded import recorded_metrics


def recorded_or_loaded(task, cfg, root: Path, champion: dict | None,
                       load: Callable[[], object]) -> tuple[dict | None, object]:
    """``(recorded scores, loaded model)`` of ``champion`` (``{"version", "tags"}`` or None): its
    recorded scores when they were measured on this split's bytes by this metric code, else the
    model from ``load()`` to be rescored; ``(None, None)`` without a champion."""
    if champion is None:
        return None, None
    recorded = recorded_metrics(champion["tags"], task.scoring_key(cfg, root), task.recorded_keys())
    return (recorded, None) if recorded is not None else (None, load())


def deserves(task, cfg, root: Path, report: dict, current: dict | None,
             load: Callable[[], object]) -> tuple[bool, str]:
    """Does the candidate of ``report`` beat ``current`` (the champion now, read under the promotion
    lock)? The scores evaluated beside it, or, when another run promoted meanwhile, the new champion's
    recorded (or else rescored, ``load()``) ones on this split; the task's champion metrics in order,
    each in its direction, by more than ``gates.min_improvement``."""
    from evaluation.evaluate import score_champion

    margin = cfg.gates.min_improvement
    if current is None:
        return beats(task, report["candidate"], None)
    if current["version"] == report.get("champion_version") and report.get("champion"):
        return beats(task, report["candidate"], report["champion"], margin)
    champ = (recorded_metrics(current.get("tags"), report["scoring_key"], task.recorded_keys())
             if report.get("scoring_key") else None)
    how = "its recorded scores"
    if champ is None:
        champ, how = score_champion(task, cfg, root, load()), "rescored"
    ok, reason = beats(task, report["candidate"], champ, margin)
    return ok, f"champion moved to v{current['version']} since evaluation ({how}); {reason}"
