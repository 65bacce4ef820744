"""Score the candidate, the champion and the trivial baseline on the same held-out split, with the
task's own ``evaluator`` or, where it has none, the per-row one here. No MLflow here."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from tasks.base import SCORES_FILE, champion_scores
from tasks.metrics import confusion_png, latency_p95_ms

log = logging.getLogger(__name__)


def worker_scores(task, cfg, root: Path, train_dir: Path) -> dict | None:
    """The training worker's scores of ``train_dir/model.pt2`` (``task.write_test_scores``) when
    their recorded hashes of the program and the split still hold; else None."""
    from core.hashing import file_sha256

    try:
        scores = json.loads((Path(train_dir) / SCORES_FILE).read_text())
        ok = (scores["model_sha256"] == file_sha256(Path(train_dir) / "model.pt2")
              and scores["split_sha256"] == task.scoring_key(cfg, root)["split_sha256"]
              and len(scores["pred"]) == scores["outputs_shape"][0] and scores["latency_ms"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return scores if ok else None


def evaluate_predictions(task, cfg, root: Path, train_dir: Path, out_dir: Path, champion=None,
                         champion_metrics: dict | None = None) -> dict:
    """The per-row evaluator: the candidate's, the champion's, the trivial baseline's and the
    gradient-boosted trees' (``task.gbdt``) metrics on the test split. The champion's are
    ``champion_metrics`` when given (recorded), else ``champion`` rescored here (``report["champion_scores"]``);
    the candidate's come from the worker when they provably match (``report["candidate_scored_in"]``).
    A decision threshold the task tunes on its held-out train rows (``task.decision_threshold``) cuts the
    candidate's labels and is its ``threshold``, registered with the model.
    Writes ``metrics.json`` (and a classifier's ``confusion_matrix.png``) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key = task.scoring_key(cfg, root)
    _, x, y, info = task.eval_data(cfg, root)
    val = task.validation_split(cfg, root)
    scored = worker_scores(task, cfg, root, train_dir)
    loaded = []

    def program(a) -> np.ndarray:  # model.pt2's outputs (loaded once) where the worker's scores do not hold
        from tasks.base import load_program, program_outputs

        loaded[:] = loaded or [load_program(Path(train_dir) / "model.pt2")]
        return program_outputs(loaded[0], a)

    if scored is not None and len(scored["pred"]) == len(y):
        pred = np.asarray(scored["pred"])
        latency = float(np.percentile(scored["latency_ms"], 95))
        val_pred = None if scored.get("val_pred") is None else np.asarray(scored["val_pred"])
        where = "worker"
    else:
        outputs = program(x)
        task.check_program_output(outputs, info)
        pred, val_pred, where = task.decode(outputs), None, "pipeline"
        import torch

        torch.set_num_threads(1)
        latency = latency_p95_ms(lambda row: program(np.asarray(row, dtype=np.float32)).argmax(1), x)
    if val is not None and (val_pred is None or len(val_pred) != len(val[1])):
        val_pred = task.decode(program(val[0]))
    threshold = None if val is None else task.decision_threshold(val[1], val_pred)
    cand = task.score(y, pred, info, **({"threshold": threshold} if threshold is not None else {}))
    cand["latency_p95_ms"] = latency
    champ, how = champion_scores(champion_metrics, champion, lambda c: task.score_champion(cfg, root, c))
    what, base_pred = task.baseline(cfg, root, info, len(y))
    baseline = {"predictor": what, **task.score(y, base_pred, info)}
    ref = task.gbdt(cfg, root)
    gbdt_skipped = ref.get("skipped") if ref is not None else None
    if gbdt_skipped:
        log.warning("%s", gbdt_skipped)
        ref = None
    gbdt = None if ref is None else {"predictor": ref["predictor"], "fit_s": ref["fit_s"],
                                     "predict_s": ref["predict_s"], "cached": ref.get("cached", False),
                                     **task.score(y, _padded(ref.get("proba"), pred) if "proba" in ref
                                                  else ref["pred"], info)}
    files = {}
    if "confusion_matrix" in cand:
        primary = task.primary or task.champion_metrics[0]
        files["confusion_matrix"] = str(confusion_png(cand["confusion_matrix"], out_dir / "confusion_matrix.png",
                                                      f"candidate: {primary} {cand[primary]:.4f}",
                                                      names=task.class_names(info)))
    report = {"candidate": cand, "champion": champ, "champion_scores": how, "baseline": baseline, "gbdt": gbdt,
              **({"gbdt_skipped": gbdt_skipped} if gbdt_skipped else {}),
              "scoring_key": key, "candidate_scored_in": where, "files": files,
              "class_names": task.class_names(info)}
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=2, default=str))
    return report


def _padded(proba, like: np.ndarray) -> np.ndarray:
    """The trees' class probabilities with a column of zeros for each class their train rows lacked
    (the candidate's ``like`` has one column per class)."""
    proba = np.asarray(proba, dtype=np.float64)
    return np.pad(proba, ((0, 0), (0, max(like.shape[1] - proba.shape[1], 0)))) if like.ndim == 2 else proba


def evaluate(task, cfg, root: Path, train_dir: Path, out_dir: Path, champion=None,
             champion_metrics: dict | None = None) -> dict:
    """The task's evaluator on the candidate in ``train_dir``."""
    own = task.evaluator()
    return (own.evaluate if own is not None else evaluate_predictions)(task, cfg, root, train_dir, out_dir,
                                                                       champion, champion_metrics)


def score_champion(task, cfg, root: Path, predictor) -> dict:
    """The current champion (a loaded registry model) scored on this run's evaluation split."""
    own = task.evaluator()
    if own is None:
        return task.score_champion(cfg, root, predictor)
    return own.score_champion(task, cfg, root, predictor)
