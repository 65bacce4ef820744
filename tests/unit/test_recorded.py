"""Recorded-score tags, the scoring key, the confusion PNG and the cheap requirements check."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import evaluation.recorded as recorded
import tasks.tabular as tabular
from core.config import PipelineConfig
from tasks import get_task
from tasks.metrics import classification_metrics, confusion_layout, confusion_png, ranking_metrics

CLS = get_task("classification")
LM = get_task("lm")
CFG = PipelineConfig(name="t", dataset={"path": "data/digits", "expectations_file": "exp.yaml"})
LM_METRICS = {"loss": 1.2345678901234567, "perplexity": math.exp(1.2345678901234567),
              "bits_per_byte": 1.2345678901234567 / math.log(2), "n_tokens": 1000, "n_docs": 4,
              "latency_p95_ms": 3.0}
EXPECTATIONS = """label: label
columns:
  - {name: f0, type: integer}
  - {name: f1, type: integer}
  - {name: f2, type: integer}
  - {name: label, type: integer, values: [0, 1, 2]}
"""


@pytest.fixture
def split(tmp_path):
    folder = tmp_path / "data" / "digits"
    folder.mkdir(parents=True)
    (folder / "test.csv").write_text("f0,f1,f2,label\n1,2,3,0\n4,5,6,1\n7,8,9,2\n")
    (folder / "train.csv").write_text("f0,f1,f2,label\n1,2,3,0\n4,5,6,1\n7,8,9,2\n")
    (tmp_path / "exp.yaml").write_text(EXPECTATIONS)
    return tmp_path


def metrics():
    y, p = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 1, 1, 2, 0])
    m = classification_metrics(y, p, 3)
    return {**m, **ranking_metrics(y, np.eye(3)[p] * 0.8 + 0.2 / 3), "latency_p95_ms": 1.5}


def test_recorded_scores_round_trip_exactly_under_the_same_key(split):
    key = CLS.scoring_key(CFG, split)
    tags = recorded.record_tags(key, metrics(), CLS.recorded_keys())
    assert tags["eval_split_sha256"] == key["split_sha256"]
    assert tags["eval_metrics_version"] == str(tabular.METRICS_VERSION)
    got = recorded.recorded_metrics(tags, CLS.scoring_key(CFG, split), CLS.recorded_keys())
    assert got == {k: v for k, v in metrics().items() if k != "latency_p95_ms"}
    lm_keys = LM.recorded_keys()
    lm = recorded.recorded_metrics(recorded.record_tags(key, LM_METRICS, lm_keys), key, lm_keys)
    assert lm["loss"] == LM_METRICS["loss"] and lm["perplexity"] == LM_METRICS["perplexity"]


def test_the_key_changes_with_the_split_bytes_the_metric_version_and_the_labels(split, monkeypatch):
    key = CLS.scoring_key(CFG, split)["key"]
    assert CLS.scoring_key(CFG, split)["key"] == key
    (split / "exp.yaml").write_text(EXPECTATIONS.replace("[0, 1, 2]", "[0, 1, 2, 3]"))  # another class set
    assert CLS.scoring_key(CFG, split)["key"] != key
    (split / "exp.yaml").write_text(EXPECTATIONS)
    (split / "exp2.yaml").write_text(EXPECTATIONS.replace("label: label", "label: f2").replace(
        "{name: f2, type: integer}", "{name: f2, type: integer, values: [3, 6, 9]}"))
    other_label = CFG.model_copy(update={"dataset": CFG.dataset.model_copy(
        update={"label": "f2", "expectations_file": "exp2.yaml"})})
    assert CLS.scoring_key(other_label, split)["key"] != key
    monkeypatch.setattr(type(CLS), "metrics_version", tabular.METRICS_VERSION + 1)
    assert CLS.scoring_key(CFG, split)["key"] != key
    monkeypatch.undo()
    test = split / "data" / "digits" / "test.csv"
    test.write_text(test.read_text().replace("7,8,9,2", "7,8,9,1"))  # one label differs
    assert CLS.scoring_key(CFG, split)["key"] != key


def test_one_file_split_by_seed_keys_on_the_seed_and_fraction(split):
    (split / "data" / "digits" / "all.csv").write_text("f0,f1,f2,label\n" + "1,2,3,0\n4,5,6,1\n7,8,9,2\n" * 4)
    ds = {"path": "data/digits", "file": "all.csv", "expectations_file": "exp.yaml"}
    one = PipelineConfig(name="t", dataset=ds)
    key = CLS.scoring_key(one, split)["key"]
    assert CLS.scoring_key(one.model_copy(update={"seed": 1}), split)["key"] != key
    assert CLS.scoring_key(PipelineConfig(name="t", dataset={**ds, "test_fraction": 0.5}), split)["key"] != key


def test_missing_other_or_broken_records_mean_rescore(split):
    keys = CLS.recorded_keys()
    key = CLS.scoring_key(CFG, split)
    tags = recorded.record_tags(key, metrics(), keys)
    other = {**key, "key": "0" * 64}
    assert recorded.recorded_metrics(tags, other, keys) is None
    assert recorded.recorded_metrics({}, key, keys) is None
    assert recorded.recorded_metrics(None, key, keys) is None
    assert recorded.recorded_metrics({**tags, "eval_metrics": tags["eval_metrics"][:40]}, key, keys) is None
    partial = json.loads(tags["eval_metrics"])
    del partial["macro_f1"]
    assert recorded.recorded_metrics({**tags, "eval_metrics": json.dumps(partial)}, key, keys) is None
    assert recorded.recorded_metrics(tags, key, LM.recorded_keys()) is None  # a classifier's record is no LM's
    with pytest.raises(ValueError, match="lack"):
        recorded.record_tags(key, {"accuracy": 1.0}, keys)


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
