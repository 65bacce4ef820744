"""Score the candidate (and the current champion) on the same held-out split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from core.config import DatasetConfig
from evaluation.metrics import Predictor, classification_metrics, confusion_png, latency_p95_ms, torch_predictor
from evaluation.recorded import scoring_key


def load_test_split(cfg: DatasetConfig, root: Path) -> tuple[np.ndarray, np.ndarray]:
    from training.data import read_csv

    return read_csv(root / cfg.path / cfg.test_file, cfg.columns, cfg.label_column)


def worker_scores(path: Path, model_pt2: Path, cfg: DatasetConfig, root: Path) -> dict | None:
    """The training worker's scores of ``model_pt2`` on the test split (``training/worker.py``
    ``write_test_scores``), when they are provably of this program and this split: the file's
    hashes equal both files' now, and it has one prediction per test row from a program with
    one logit per class. Else None: the caller scores the program itself."""
    import json as _json

    from core.hashing import file_sha256

    try:
        scores = _json.loads(Path(path).read_text())
        ok = (scores["model_sha256"] == file_sha256(model_pt2)
              and scores["split_sha256"] == file_sha256(root / cfg.path / cfg.test_file)
              and list(scores["logits_shape"])[1:] == [cfg.n_classes]
              and len(scores["pred"]) == scores["logits_shape"][0] and scores["latency_ms"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return scores if ok else None


def evaluate(model_pt2: Path, cfg: DatasetConfig, root: Path, out_dir: Path,
             champion: Predictor | None = None, champion_metrics: dict | None = None,
             scored: dict | None = None) -> dict:
    """Metrics of the exported candidate and of the champion on the test split.

    The champion's are ``champion_metrics`` when given (its recorded scores, see
    ``evaluation.recorded``), else ``champion``'s predictions scored here, else None.
    ``report["champion_scores"]`` says which: "recorded", "rescored" or None.
    ``report["scoring_key"]`` is what the candidate's scores hold for (to record them).
    ``scored``: the candidate's predictions and one-row latencies, made by the training worker
    (``worker_scores``); without them the program is loaded and scored here, the same way.
    ``report["candidate_scored_in"]`` says where: "worker" or "pipeline".
    Writes ``confusion_matrix.png`` and ``metrics.json`` into ``out_dir``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    key = scoring_key(cfg, root)
    x, y = load_test_split(cfg, root)
    if scored is not None and len(scored["pred"]) == len(y):
        cand = classification_metrics(y, np.asarray(scored["pred"], dtype=np.int64), cfg.n_classes)
        cand["latency_p95_ms"] = float(np.percentile(scored["latency_ms"], 95))
        where = "worker"
    else:
        from training.export import load_exported

        predict = torch_predictor(load_exported(model_pt2))
        cand = classification_metrics(y, predict(x), cfg.n_classes)
        cand["latency_p95_ms"] = latency_p95_ms(predict, x)
        where = "pipeline"
    champ, how = None, None
    if champion_metrics is not None:
        champ, how = champion_metrics, "recorded"
    elif champion is not None:
        champ = classification_metrics(y, np.asarray(champion(x)).astype(np.int64), cfg.n_classes)
        how = "rescored"
    png = confusion_png(cand["confusion_matrix"], out_dir / "confusion_matrix.png",
                        f"candidate: accuracy {cand['accuracy']:.4f}")
    report = {"candidate": cand, "champion": champ, "champion_scores": how, "scoring_key": key,
              "candidate_scored_in": where,
              "files": {"confusion_matrix": str(png)}}
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=2))
    return report
