"""The table tasks without a pipeline: features by name, labels as people have them, scaling fitted
on train and baked into the model, missing values imputed, baselines, and what a config must hold."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from core.config import PipelineConfig
from core.errors import ConfigError, DataUnavailableError
from tasks import get_task, task_for

CLS = get_task("classification")
REG = get_task("regression")
EXPECTATIONS = """label: kind
columns:
  - {name: a, type: float}
  - {name: b, type: integer, nulls: true}
  - {name: note, type: string}
  - {name: kind, type: string, values: [red, green, blue]}
"""


@pytest.fixture
def root(tmp_path):
    rng = np.random.default_rng(0)
    n = 60
    df = pd.DataFrame({"a": rng.normal(100, 20, n), "b": rng.integers(0, 5, n).astype("float64"),
                       "note": ["x"] * n, "kind": rng.choice(["red", "green", "blue"], n)})
    df.loc[3, "b"] = np.nan
    (tmp_path / "data").mkdir()
    df.to_csv(tmp_path / "data" / "t.csv", index=False)
    (tmp_path / "exp.yaml").write_text(EXPECTATIONS)
    return tmp_path


def cfg(**dataset) -> PipelineConfig:
    ds = {"path": "data", "file": "t.csv", "label": "kind", "exclude": ["note"], "expectations_file": "exp.yaml",
          **dataset}
    return PipelineConfig(name="t", dataset=ds, model={"kind": "mlp", "hidden": 8})


def test_features_are_every_column_but_the_label_and_the_excluded_ones(root):
    info = CLS.info(cfg(), root)
    assert info.features == ["a", "b"]
    assert info.dtypes == {"a": "double", "b": "double"}
    assert CLS.info(cfg(features=["b"], exclude=[]), root).features == ["b"]


def test_string_labels_map_to_the_reviewed_class_order_and_back(root):
    info = CLS.info(cfg(), root)
    assert info.classes == ["red", "green", "blue"]  # the expectations file's order, not sorted
    y = CLS.targets(pd.Series(["blue", "red"]), info)
    assert y.tolist() == [2, 0]
    assert CLS.encode(np.array(["green", "purple"]), info).tolist() == [1, -1]
    with pytest.raises(DataUnavailableError, match=r"outside the recorded class set"):
        CLS.targets(pd.Series(["purple"]), info)


def test_scaling_is_fitted_on_train_ignoring_nulls_and_a_null_is_imputed_with_the_mean(root):
    c = cfg()
    splits = CLS.load_data(c, root, seed=0)
    info = splits.info
    train = CLS.frames(c, root)["train"]
    assert info.mean[0] == pytest.approx(train["a"].mean())
    assert np.isfinite(info.mean).all() and np.isfinite(info.std).all()
    model = CLS.build_model(c, info).eval()
    x = torch.tensor([[info.mean[0], np.nan]], dtype=torch.float32)
    z = model[0](x)  # the input layer (mlp: standardised numerics)
    # The mean maps to 0, a missing value too, and b (which had a null in train) gets a missing
    # indicator beside it: 1 here.
    assert z.tolist() == [[0.0, 0.0, 1.0]]
    assert torch.isfinite(model(x)).all()
    assert len(splits.train) + len(splits.val) == len(train)


def test_regression_trains_on_standardised_targets_and_exports_in_their_units(tmp_path):
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"x": rng.uniform(0, 1, 40)})
    df["y"] = 1000 + 500 * df["x"]
    (tmp_path / "d").mkdir()
    df.to_csv(tmp_path / "d" / "r.csv", index=False)
    (tmp_path / "e.yaml").write_text("label: y\ncolumns:\n  - {name: x, type: float}\n  - {name: y, type: float}\n")
    c = PipelineConfig(name="r", task="regression", dataset={"path": "d", "file": "r.csv", "label": "y",
                                                             "expectations_file": "e.yaml"}, model={"kind": "mlp"})
    splits = REG.load_data(c, tmp_path, seed=0)
    y = splits.train.tensors[1]
    assert abs(float(y.mean())) < 0.5 and 0.5 < float(y.std()) < 1.5  # standardised
    exported = REG.export_module(REG.build_model(c, splits.info), splits.info)
    with torch.no_grad():
        out = exported(torch.tensor([[0.5]]))
    assert out.shape == (1, 1)
    affine = exported[1]
    assert float(affine.shift) == pytest.approx(splits.info.y_mean) and float(affine.scale) > 100
    name, pred = REG.baseline(c, tmp_path, splits.info, 7)
    assert "mean" in name and pred.shape == (7,) and np.all(pred == splits.info.y_mean)


def test_a_table_config_needs_its_expectations_and_an_importable_factory():
    with pytest.raises(ConfigError, match=r"dataset\.expectations_file: required"):
        task_for(PipelineConfig(name="t", dataset={"path": "d"}, model={"kind": "mlp"}))
    with pytest.raises(ConfigError, match=r"model\.factory: module 'no_such_module_here' not found"):
        task_for(PipelineConfig(name="t", dataset={"path": "d", "expectations_file": "e.yaml"},
                                model={"factory": "no_such_module_here:make"}))
    with pytest.raises(ConfigError, match=r"training\.early_stopping\.metric: task 'regression' reports no"):
        task_for(PipelineConfig(name="t", task="regression", dataset={"path": "d", "expectations_file": "e.yaml"},
                                training={"early_stopping": {"metric": "val_accuracy"}}))


def test_a_model_factory_builds_the_core_network_behind_the_scaling(root, tmp_path, monkeypatch):
    (tmp_path / "mynets.py").write_text(
        "import torch.nn as nn\n"
        "def make(n_in, n_out, width=4):\n"
        "    return nn.Sequential(nn.Linear(n_in, width), nn.Tanh(), nn.Linear(width, n_out))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    c = cfg().model_copy(update={"model": cfg().model.model_copy(update={"factory": "mynets:make",
                                                                        "kwargs": {"width": 5}})})
    task_for(c)
    model = CLS.build_model(c, CLS.info(c, root))
    assert model[1][0].out_features == 5 and model[1][-1].out_features == 3


def test_prepared_arrays_are_cached_by_content_and_read_back_without_the_table(root, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(root / "home"))
    c = cfg()
    task = type(CLS)()  # a fresh instance: nothing remembered in memory
    first = task.prepared(c, root)
    cached = list((root / "home" / "cache" / "tables").glob("*.npz"))
    assert len(cached) == 1 and cached[0].with_suffix(".json").is_file()

    again = type(CLS)()
    monkeypatch.setattr(again, "frames", lambda *a: (_ for _ in ()).throw(AssertionError("table read again")))
    second = again.prepared(c, root)
    for k in ("x", "y", "xt", "yt"):
        np.testing.assert_array_equal(first[k], second[k])
    assert second["info"] == first["info"] and json.loads(json.dumps(first["info"].to_json())) == first["info"].to_json()
    # Other bytes in the table: another key, read afresh.
    df = pd.read_csv(root / "data" / "t.csv")
    df.loc[0, "a"] = 1e6
    df.to_csv(root / "data" / "t.csv", index=False)
    third = type(CLS)().prepared(c, root)
    assert len(list((root / "home" / "cache" / "tables").glob("*.npz"))) == 2
    assert max(np.nanmax(third["x"]), np.nanmax(third["xt"])) == pytest.approx(1e6)


def test_gradient_boosted_trees_fit_on_the_train_split_once_per_data(root, monkeypatch):
    """The reference a user would try first: fitted with the same encoded columns (categories as
    categories, NaN as missing) on one thread; a second evaluation of the same data reads it back."""
    monkeypatch.setenv("TRAINFLOW_HOME", str(root / "home"))
    c = cfg(exclude=[])  # note: a text column, a category for the trees too
    task = type(CLS)()
    first = task.gbdt(c, root)
    n_test = len(task.frames(c, root)["test"])
    assert first["pred"].shape == (n_test,) and set(first["pred"].tolist()) <= {0, 1, 2}
    assert "HistGradientBoostingClassifier" in first["predictor"] and "1 thread" in first["predictor"]
    assert first["cached"] is False and first["fit_s"] > 0
    again = type(CLS)()
    import sklearn.ensemble

    monkeypatch.setattr(sklearn.ensemble.HistGradientBoostingClassifier, "fit",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("fitted again")))
    second = again.gbdt(c, root)
    assert second["cached"] is True and second["pred"].tolist() == first["pred"].tolist()
    assert second["fit_s"] == first["fit_s"]


def test_the_trees_see_categories_as_categories_and_missing_as_missing():
    from tasks.encoding import MISSING_CODE, OTHER_CODE
    from tasks.tabular import _gbdt_matrix

    x = np.array([[1.5, MISSING_CODE], [np.nan, OTHER_CODE], [2.0, 2], [3.0, 300]], dtype=np.float32)
    out = _gbdt_matrix(x, np.array([False, True]))
    assert np.isnan(out[0, 1]) and out[1, 1] == 0 and out[2, 1] == 1 and out[3, 1] == 0  # 300: past 254 -> other
    assert np.isnan(out[1, 0]) and out[0, 0] == 1.5


@pytest.mark.parametrize("rows, smallest, largest, batch", [
    (0, 32, 1024, 32), (1_000, 32, 1024, 32), (6_000, 32, 1024, 128), (50_000, 32, 1024, 1024),
    (10_000_000, 32, 1024, 1024), (1_438, 16, 256, 32), (100_000, 16, 256, 256),
])
def test_init_sizes_the_batch_for_about_forty_steps_per_epoch_on_two_workers(rows, smallest, largest, batch):
    from tasks.base import init_batch

    assert init_batch(rows, smallest, largest) == batch
    if smallest < batch < largest:  # not clamped: between 20 and 40 steps per worker
        assert 20 < rows / (2 * batch) <= 40
