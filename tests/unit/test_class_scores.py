"""Classifiers as users score them: probabilities out of the registered model, ranking metrics for every
predictor, the metric the config picks, class weights, the decision threshold and the one-class refusal."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from core.config import GatesConfig, PipelineConfig
from core.errors import ConfigError
from evaluation.gates import beats, decide
from evaluation.report import gate_markdown
from tasks import get_task
from tests.pyfuncs import pyfunc_module

CLS = get_task("classification")
INFO = SimpleNamespace(classes=["bad", "good"])


def _pyfunc(file: str, cls: str, meta: dict, tmp_path, logits):
    """The models-from-code file's model, loaded as MLflow loads it, over a program giving ``logits``."""
    module = pyfunc_module(file)
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    model = getattr(module, cls)()
    original = torch.export.load
    torch.export.load = lambda path: SimpleNamespace(module=lambda: lambda x: torch.as_tensor(logits[:len(x)]))
    try:
        model.load_context(SimpleNamespace(artifacts={"meta": str(tmp_path / "meta.json"), "model": "unused"}))
    finally:
        torch.export.load = original
    return model


TABLE_META = {"feature_columns": ["a"], "columns": [{"name": "a", "kind": "numeric"}], "class_labels": ["bad", "good"]}
LOGITS = torch.tensor([[2.0, 0.0], [0.0, 0.1], [0.3, 0.0], [-1.0, 2.0]])


def test_the_table_pyfunc_returns_probabilities_named_by_the_labels_and_cuts_by_its_threshold(tmp_path):
    frame = pd.DataFrame({"a": [1.0, 2.0, 3.0, 4.0]})
    model = _pyfunc("pyfunc_table.py", "ExportedTable", TABLE_META, tmp_path, LOGITS)
    proba = model.predict(None, frame, params={"predict_method": "predict_proba"})
    assert isinstance(proba, pd.DataFrame) and list(proba.columns) == ["bad", "good"]
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_allclose(proba.to_numpy(), torch.softmax(LOGITS.double(), 1).numpy())
    assert list(model.predict(None, frame)) == ["bad", "good", "bad", "good"]  # labels stay the default
    cut = _pyfunc("pyfunc_table.py", "ExportedTable", {**TABLE_META, "threshold": 0.4}, tmp_path, LOGITS)
    assert list(cut.predict(None, frame)) == ["bad", "good", "good", "good"]  # p(good) of row 3 is 0.43
    assert list(cut.predict(None, frame.head(0), params={"predict_method": "predict_proba"}).columns) == ["bad", "good"]
    with pytest.raises(ValueError, match="predict_method: must be one of predict, predict_proba"):
        model.predict(None, frame, params={"predict_method": "predict_log_proba"})
    regression = _pyfunc("pyfunc_table.py", "ExportedTable", {**TABLE_META, "class_labels": None}, tmp_path, LOGITS)
    with pytest.raises(ValueError, match="must be one of predict,"):
        regression.predict(None, frame, params={"predict_method": "predict_proba"})


def test_the_image_pyfunc_returns_probabilities_named_by_the_classes(tmp_path):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4, 4), 128).save(buf, format="PNG")
    meta = {"size": [4, 4], "channels": 1, "class_labels": ["cat", "dog", "owl"]}
    logits = torch.tensor([[0.0, 1.0, 0.0], [3.0, 0.0, 0.0]])
    model = _pyfunc("pyfunc_image.py", "ExportedImageClassifier", meta, tmp_path, logits)
    frame = pd.DataFrame({"image": [buf.getvalue()] * 2})
    proba = model.predict(None, frame, params={"predict_method": "predict_proba"})
    assert list(proba.columns) == ["cat", "dog", "owl"]
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert list(model.predict(None, frame)) == ["dog", "cat"]
    two = {**meta, "class_labels": ["cat", "dog"], "threshold": 0.2}
    cut = _pyfunc("pyfunc_image.py", "ExportedImageClassifier", two, tmp_path, torch.tensor([[0.0, -1.0], [3.0, 0.0]]))
    assert list(cut.predict(None, frame)) == ["dog", "cat"]  # p(dog) 0.27 and 0.05 against the cut 0.2


def test_the_signature_declares_predict_method_so_mlflow_passes_it_through():
    from mlflow.models.utils import _enforce_params_schema

    from registry.models import signature_of
    from tasks.base import ModelSpec

    spec = ModelSpec(Path("x.py"), {}, [("a", "double")], [(None, "string")], None, params=list(CLS.predict_params))
    params = signature_of(spec).params
    assert [(p.name, p.default) for p in params.params] == [("predict_method", "predict")]
    assert _enforce_params_schema({"predict_method": "predict_proba"}, params) == {"predict_method": "predict_proba"}
    assert _enforce_params_schema(None, params) == {"predict_method": "predict"}
    assert signature_of(ModelSpec(Path("x.py"), {}, [("a", "double")], [(None, "double")], None)).params is None


def test_scores_of_probabilities_labels_and_the_majority_baseline():
    y = np.array([0] * 8 + [1] * 2)
    p1 = np.array([0.1] * 7 + [0.35, 0.3, 0.4])
    proba = np.c_[1 - p1, p1]
    argmax = CLS.score(y, proba, INFO)
    cut = CLS.score(y, proba, INFO, threshold=0.28)
    assert argmax["predicted_classes"] == 1 and argmax["balanced_accuracy"] == 0.5 and "threshold" not in argmax
    assert cut["threshold"] == 0.28 and cut["predicted_classes"] == 2 and cut["balanced_accuracy"] > 0.8
    assert argmax["roc_auc"] == cut["roc_auc"] > 0.9  # ranking metrics ignore the cut
    hard = CLS.score(y, proba.argmax(1), INFO)  # a model that gives labels only: a hard classifier
    assert hard["roc_auc"] == 0.5 and hard["log_loss"] > argmax["log_loss"]
    what, base = CLS.majority(np.array([0, 0, 0, 1]), INFO, 10)
    scored = CLS.score(y, base, INFO)
    assert what == "majority class 'bad'" and scored["roc_auc"] == 0.5 and scored["accuracy"] == 0.8
    assert scored["average_precision"] == pytest.approx(0.2)


def test_the_decision_threshold_is_tuned_for_the_primary_label_metric_and_only_for_two_classes():
    y = np.array([0] * 90 + [1] * 10)
    p1 = np.r_[np.linspace(0.0, 0.2, 90), np.linspace(0.25, 0.4, 10)]
    t = CLS.decision_threshold(y, np.c_[1 - p1, p1])
    assert 0.2 < t < 0.25 and CLS.threshold_metric() == "accuracy"
    assert CLS.with_primary("roc_auc").threshold_metric() == "macro_f1"
    assert CLS.with_primary("balanced_accuracy").threshold_metric() == "balanced_accuracy"
    assert CLS.decision_threshold(np.array([0, 1, 2]), np.eye(3)) is None


def test_primary_metric_picks_what_the_gates_and_promotion_judge_by():
    cfg = PipelineConfig(name="t", dataset={"path": "d", "expectations_file": "e.yaml"}, primary_metric="roc_auc")
    assert cfg.config_id() != PipelineConfig(name="t", dataset={"path": "d", "expectations_file": "e.yaml"}).config_id()
    task = CLS.with_primary(cfg.primary_metric)
    assert task.primary == "roc_auc" and task.champion_metrics == ("roc_auc",) and CLS.primary == "accuracy"
    assert CLS.with_primary(None) is CLS and CLS.with_primary("accuracy") is CLS
    gates = GatesConfig(baseline_margin=0.05)
    cand = {"accuracy": 0.93, "roc_auc": 0.70, "log_loss": 0.3, "predicted_classes": 2, "n": 100}
    baseline = {"accuracy": 0.95, "roc_auc": 0.5}
    assert not decide(CLS, cand, gates, baseline=baseline).passed  # by accuracy the majority wins
    d = decide(task, cand, gates, baseline=baseline)
    assert d.passed and [c.name for c in d.checks] == ["predicted_classes", "roc_auc_vs_baseline"]
    lower = CLS.with_primary("log_loss")
    assert decide(lower, cand, gates, baseline={"log_loss": 0.4}).passed
    assert not decide(lower, cand, gates, baseline={"log_loss": 0.33}).passed  # needs <= 0.28
    champion = {"accuracy": 0.95, "roc_auc": 0.60}
    assert decide(task, cand, GatesConfig(), champion, "1").passed  # its accuracy does not hold it back
    assert beats(task, cand, champion)[0] and not beats(CLS, {**cand, "macro_f1": 0.5},
                                                        {**champion, "macro_f1": 0.5})[0]
    with pytest.raises(ConfigError, match=r"^primary_metric: task 'classification' has no metric 'r2'; choose one of "
                                          r"accuracy, balanced_accuracy"):
        CLS.check_config(cfg.model_copy(update={"primary_metric": "r2"}))
    reg = cfg.model_copy(update={"primary_metric": None, "task": "regression",
                                 "training": cfg.training.model_copy(update={"class_weight": "balanced"})})
    with pytest.raises(ConfigError, match="^training.class_weight: task 'regression' is not a classifier"):
        get_task("regression").check_config(reg)


def test_a_candidate_predicting_one_class_for_every_row_is_refused_with_that_reason():
    one = {"accuracy": 0.95, "macro_f1": 0.49, "min_class_recall": 0.0, "predicted_classes": 1, "n": 200}
    d = decide(CLS, one, GatesConfig(baseline_margin=0.0), baseline={"accuracy": 0.95})
    assert not d.passed and [c.name for c in d.failures] == ["predicted_classes"]
    assert "predicted_classes = 1.0000, needs >= 2.0000 (it predicts one class for every row" in d.reasons()[0]
    assert decide(CLS, one, GatesConfig(allow_single_class=True)).passed
    md = gate_markdown(CLS, d, {**one, "class_recall": {"0": 1.0, "1": 0.0}}, None, class_names=["good", "bad"])
    assert "| good | 1.0000 |" in md and "| bad | 0.0000 |" in md and "REJECTED" in md


def test_balanced_class_weights_count_each_class_alike():
    y = np.array([0] * 9 + [1])
    task = CLS.with_class_weights(y, 2)
    assert task.class_weights == pytest.approx((10 / 18, 10 / 2)) and CLS.class_weights is None
    out, target = torch.tensor([[1.0, 0.0]] * 5 + [[0.0, 2.0]] * 5), torch.tensor(y)
    each = CLS.loss(out, target, reduction="none")
    want = float((each * torch.tensor([task.class_weights[c] for c in y])).sum())
    assert task.loss(out, target, reduction="sum").item() == pytest.approx(want, rel=1e-6)
    assert CLS.with_class_weights(np.array([0, 0]), 3).class_weights == pytest.approx((2 / 3, 4 / 3, 4 / 3))


def test_the_pyfuncs_probabilities_are_the_evaluations_to_the_last_bit(tmp_path):
    from tasks.metrics import softmax

    logits = torch.randn(50, 2, generator=torch.Generator().manual_seed(0)) * 7
    model = _pyfunc("pyfunc_table.py", "ExportedTable", TABLE_META, tmp_path, logits)
    proba = model.predict(None, pd.DataFrame({"a": np.arange(50.0)}), params={"predict_method": "predict_proba"})
    assert np.array_equal(proba.to_numpy(), softmax(logits.numpy()))


def test_init_picks_the_metric_and_the_weights_from_the_class_shares():
    from flows.init import _metric_keys, choice_lines
    from tasks.tabular import _metric_choice

    rare = _metric_choice(pd.Series(["good"] * 95 + ["bad"] * 5))
    assert rare["metric"][0] == "average_precision" and rare["class_weight"][0] == "balanced"
    assert "the rarest class 'bad' is 5.0% of the rows" in rare["metric"][1] and "95.0% accuracy" in rare["metric"][1]
    assert _metric_choice(pd.Series([0] * 81 + [1] * 19))["metric"][0] == "average_precision"  # under 20 %
    even = _metric_choice(pd.Series([0] * 79 + [1] * 21))
    assert even["metric"][0] is None and even["class_weight"] is None and even["metric"][1].startswith("accuracy")
    assert _metric_choice(pd.Series(list(range(10)) * 10))["metric"][0] is None  # ten classes at 10 % each
    assert _metric_choice(pd.Series(["a"] * 60 + ["b"] * 37 + ["c"] * 3))["metric"][0] == "roc_auc"
    raw = {"training": {"epochs": 30}}
    _metric_keys(raw, rare)
    assert raw["primary_metric"] == "average_precision" and raw["training"]["class_weight"] == "balanced"
    PipelineConfig(name="t", dataset={"path": "d", "expectations_file": "e.yaml"}, **raw)  # a valid config
    lines = choice_lines(rare)
    assert any(line.startswith("metric:       average_precision:") and line.endswith("(primary_metric)")
               for line in lines)
    assert any(line.startswith("weights:      balanced:") for line in lines)
    raw = {"training": {}}
    _metric_keys(raw, even)
    assert raw == {"training": {}}
