"""Recorded-score tags, the scoring key, the confusion PNG and the cheap requirements check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import evaluation.recorded as recorded
from core.config import DatasetConfig
from evaluation.metrics import classification_metrics, confusion_layout, confusion_png

DS = DatasetConfig(path="data/digits", n_features=3, feature_prefix="f", n_classes=3)
LM_METRICS = {"kind": "lm", "loss": 1.2345678901234567, "perplexity": math.exp(1.2345678901234567),
              "bits_per_byte": 1.2345678901234567 / math.log(2), "n_tokens": 1000, "n_docs": 4,
              "latency_p95_ms": 3.0}


@pytest.fixture
def split(tmp_path):
    folder = tmp_path / "data" / "digits"
    folder.mkdir(parents=True)
    (folder / "test.csv").write_text("f0,f1,f2,label\n1,2,3,0\n4,5,6,1\n7,8,9,2\n")
    return tmp_path


def metrics():
    m = classification_metrics(np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 2, 0]), 3)
    return {**m, "latency_p95_ms": 1.5}


def test_recorded_scores_round_trip_exactly_under_the_same_key(split):
    key = recorded.scoring_key(DS, split)
    tags = recorded.record_tags(key, metrics(), "tabular")
    assert tags["eval_split_sha256"] == key["split_sha256"] and tags["eval_metrics_version"] == "1"
    got = recorded.recorded_metrics(tags, recorded.scoring_key(DS, split), "tabular")
    assert got == {k: v for k, v in metrics().items() if k != "latency_p95_ms"}
    lm = recorded.recorded_metrics(recorded.record_tags(key, LM_METRICS, "text"), key, "text")
    assert lm["loss"] == LM_METRICS["loss"] and lm["perplexity"] == LM_METRICS["perplexity"]


def test_the_key_changes_with_the_split_bytes_the_metric_version_and_the_labels(split, monkeypatch):
    key = recorded.scoring_key(DS, split)["key"]
    assert recorded.scoring_key(DS, split)["key"] == key
    assert recorded.scoring_key(DS.model_copy(update={"n_classes": 4}), split)["key"] != key
    assert recorded.scoring_key(DS.model_copy(update={"label_column": "y"}), split)["key"] != key
    monkeypatch.setattr(recorded, "METRICS_VERSION", recorded.METRICS_VERSION + 1)
    assert recorded.scoring_key(DS, split)["key"] != key
    monkeypatch.undo()
    test = split / "data" / "digits" / "test.csv"
    test.write_text(test.read_text().replace("7,8,9,2", "7,8,9,1"))  # one label differs
    assert recorded.scoring_key(DS, split)["key"] != key


def test_missing_other_or_broken_records_mean_rescore(split):
    key = recorded.scoring_key(DS, split)
    tags = recorded.record_tags(key, metrics(), "tabular")
    other = {**key, "key": "0" * 64}
    assert recorded.recorded_metrics(tags, other, "tabular") is None
    assert recorded.recorded_metrics({}, key, "tabular") is None
    assert recorded.recorded_metrics(None, key, "tabular") is None
    assert recorded.recorded_metrics({**tags, "eval_metrics": tags["eval_metrics"][:40]}, key, "tabular") is None
    partial = json.loads(tags["eval_metrics"])
    del partial["macro_f1"]
    assert recorded.recorded_metrics({**tags, "eval_metrics": json.dumps(partial)}, key, "tabular") is None
    assert recorded.recorded_metrics(tags, key, "text") is None  # a classifier's record is no LM's
    with pytest.raises(ValueError, match="lack"):
        recorded.record_tags(key, {"accuracy": 1.0}, "tabular")


def test_confusion_png_is_a_png_whose_cells_shade_with_the_counts(tmp_path):
    from PIL import Image

    matrix = [[9, 1, 0], [0, 5, 5], [2, 0, 8]]
    path = confusion_png(matrix, tmp_path / "cm.png", "candidate: accuracy 0.7333")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = Image.open(path)
    assert img.format == "PNG"
    cell, left, top = confusion_layout(3)

    def shade(i, j):  # a pixel near the cell's corner, away from the count's digits
        return sum(img.getpixel((left + j * cell + 2, top + i * cell + 2)))

    # darker (smaller RGB sum) with a larger count; equal counts, equal shade
    assert shade(0, 0) < shade(2, 2) < shade(1, 1) < shade(2, 0) < shade(0, 1) < shade(0, 2)
    assert shade(1, 1) == shade(1, 2) and shade(0, 2) == shade(1, 0)


def test_requirement_mismatches_name_unsatisfied_pins():
    from importlib.metadata import version

    from registry.models import requirement_mismatches

    numpy_now = version("numpy")
    assert requirement_mismatches([f"numpy=={numpy_now}", "# comment", "-r other.txt", ""]) == []
    got = requirement_mismatches(["numpy==0.0.1", "surely-not-installed-pkg==1.0"])
    assert got == [f"numpy (current: {numpy_now}, required: numpy==0.0.1)",
                   "surely-not-installed-pkg (current: uninstalled, required: surely-not-installed-pkg==1.0)"]
