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


def evaluate(model_pt2: Path, cfg: DatasetConfig, root: Path, out_dir: Path,
             champion: Predictor | None = None, champion_metrics: dict | None = None) -> dict:
    """Metrics of the exported candidate and of the champion on the test split.

    The champion's are ``champion_metrics`` when given (its recorded scores, see
    ``evaluation.recorded``), else ``champion``'s predictions scored here, else None.
    ``report["champion_scores"]`` says which: "recorded", "rescored" or None.
    ``report["scoring_key"]`` is what the candidate's scores hold for (to record them).
    Writes ``confusion_matrix.png`` and ``metrics.json`` into ``out_dir``.
    """
    from training.export import load_exported

    out_dir.mkdir(parents=True, exist_ok=True)
    key = scoring_key(cfg, root)
    x, y = load_test_split(cfg, root)
    predict = torch_predictor(load_exported(model_pt2))
    cand = classification_metrics(y, predict(x), cfg.n_classes)
    cand["latency_p95_ms"] = latency_p95_ms(predict, x)
    champ, how = None, None
    if champion_metrics is not None:
        champ, how = champion_metrics, "recorded"
    elif champion is not None:
        champ = classification_metrics(y, np.asarray(champion(x)).astype(np.int64), cfg.n_classes)
        how = "rescored"
    png = confusion_png(cand["confusion_matrix"], out_dir / "confusion_matrix.png",
                        f"candidate: accuracy {cand['accuracy']:.4f}")
    report = {"candidate": cand, "champion": champ, "champion_scores": how, "scoring_key": key,
              "files": {"confusion_matrix": str(png)}}
    (out_dir / "metrics.json").write_text(json.dumps(report, indent=2))
    return report
