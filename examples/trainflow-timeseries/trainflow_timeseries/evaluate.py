"""The example's evaluator (``SequenceForecast.evaluator``): trainflow's per-row scoring of the
candidate, the champion, persistence and the trees through the task's hooks, and the forecast's skill
over persistence (``1 - rmse / persistence's rmse``: 0 no better, 1 perfect) in ``metrics.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.evaluate import evaluate_predictions


def evaluate(task, cfg, root: Path, train_dir: Path, out_dir: Path, champion=None,
             champion_metrics: dict | None = None) -> dict:
    report = evaluate_predictions(task, cfg, root, train_dir, out_dir, champion, champion_metrics)
    persistence = report["baseline"]["rmse"]
    report["skill_vs_persistence"] = 1.0 - report["candidate"]["rmse"] / persistence if persistence else None
    (Path(out_dir) / "metrics.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def score_champion(task, cfg, root: Path, predictor) -> dict:
    return task.score_champion(cfg, root, predictor)
