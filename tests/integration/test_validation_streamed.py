"""Bounded-memory validation with real GX: a table validated batch by batch (Parquet row groups,
a folder of Parquet files, CSV blocks) gives the report the in-memory run gives, failures named
and counted the same, with bad rows spread over several batches."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from core.config import DatasetConfig
from core.expectations import ColumnExpectation, TableExpectations
from tasks.base import ValidationPlan
from tasks.table import load_frames
from tests.tables import validate_table
from validation.gx_run import data_hash, run_plan
from validation.suite import run as validate

pytestmark = pytest.mark.integration

FEATURES = ["x0", "x1", "x2", "k"]
EXP = TableExpectations(
    label="label",
    columns=[*(ColumnExpectation(name=f"x{i}", type="float", min=0, max=10) for i in range(3)),
             ColumnExpectation(name="k", type="integer", min=0, max=4),
             ColumnExpectation(name="label", type="integer", values=[0, 1, 2])],
    rows={"train": [900, 1100]}, class_share=[0.2, 0.5])


def _table(n: int, seed: int) -> pd.DataFrame:
    r = np.random.default_rng(seed)
    df = pd.DataFrame({f"x{i}": r.uniform(0, 10, n).round(3) for i in range(3)})
    df["k"] = r.integers(0, 5, n)
    df["label"] = r.choice([0, 1, 2], n)
    return df


@pytest.fixture(scope="module")
def bad():
    """Train and test with bad rows in different batches of 64: values below min, nulls, labels
    outside the class set, a value above max in test, two test rows copied from train."""
    train, test = _table(1000, 1), _table(300, 2)
    train.loc[[5, 250, 777], "x1"] = -1.0
    train.loc[[10, 600], "x2"] = np.nan
    train.loc[[333, 901], "label"] = 7
    test.loc[150, "x0"] = 99.0
    test.iloc[[3, 200]] = train.iloc[[40, 41]].to_numpy()
    return train, test


def _params(cfg: DatasetConfig, root, **extra) -> dict:
    return {"dataset": cfg, "root": root, "seed": 0, "stratify": True, "expectations": EXP,
            "features": FEATURES, "label": "label", "class_label": True, **extra}


def test_batches_merge_to_the_one_piece_result_with_bad_rows_spread_over_batches(bad, tmp_path):
    train, test = bad
    (tmp_path / "data").mkdir()
    train.to_parquet(tmp_path / "data" / "train.parquet", row_group_size=128)
    test.to_parquet(tmp_path / "data" / "test.parquet", row_group_size=100)
    cfg = DatasetConfig(path="data", train_file="train.parquet", test_file="test.parquet")
    one = validate_table(EXP, FEATURES, "label", load_frames(cfg, tmp_path, 0, True), tmp_path / "one",
                         class_label=True)
    many = validate(_params(cfg, tmp_path, batch_rows=64, stream_above_bytes=0), tmp_path / "many")
    assert [(f["split"], f["check"], f["column"], f["unexpected_count"]) for f in many["failures"]] == [
        ("train", "range", "x1", 3), ("train", "nulls", "x2", 2), ("train", "label_set", "label", 2),
        ("test", "range", "x0", 1), ("cross", "leak", None, 4)]
    assert many["failures"] == one["failures"]  # rows, examples and wording too
    for key in ("success", "n_expectations", "n_failed", "rows", "skipped"):
        assert many[key] == one[key], key
    # One GX result per item, as the in-memory run writes, each merged from every batch.
    result = json.loads((tmp_path / "many" / "gx_result.json").read_text())["validations"]
    whole = json.loads((tmp_path / "one" / "gx_result.json").read_text())["validations"]
    assert sorted(result) == sorted(whole)
    for name in ("train", "train_cells", "test_cells", "cross"):
        counts = [{k: r["result"].get(k) for k in ("element_count", "missing_count", "unexpected_count")}
                  for r in result[name]["results"]]
        assert counts == [{k: r["result"].get(k) for k in ("element_count", "missing_count", "unexpected_count")}
                          for r in whole[name]["results"]], name
    assert {r["result"].get("element_count") for r in result["train_cells"]["results"]} == {1000 * 5}
    assert result["train"]["statistics"] == whole["train"]["statistics"]
    assert many["files"]["data_docs"] and (tmp_path / "many" / "data_docs" / "index.html").is_file()


def test_parquet_folder_validates_in_batches_and_fails_naming_the_expectation(bad, tmp_path):
    train, test = bad
    for name, df, step in (("train", train, 300), ("test", test, 150)):
        folder = tmp_path / "data" / name
        folder.mkdir(parents=True)
        for i, start in enumerate(range(0, len(df), step)):
            df.iloc[start:start + step].to_parquet(folder / f"part-{i}.parquet", row_group_size=80)
    cfg = DatasetConfig(path="data", train_file="train", test_file="test")
    plan = ValidationPlan("validation.suite", [tmp_path / "data" / "train", tmp_path / "data" / "test"],
                          _params(cfg, tmp_path))
    assert len(data_hash(plan.files)) == 64  # a folder hashes file by file
    report = run_plan(plan, tmp_path / "report")
    assert report["success"] is False and report["rows"] == {"train": 1000, "test": 300}
    named = {(f["split"], f["expectation"], f["column"]): f for f in report["failures"]}
    assert named[("train", "expect_column_values_to_not_be_null", "x2")]["rows"] == [10, 600]
    below = named[("train", "expect_column_pair_values_a_to_be_greater_than_b", "x1")]
    assert below["unexpected_count"] == 3 and below["rows"] == [5, 250, 777]
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "x1" in summary and "below min 0" in summary


def test_one_csv_split_by_seed_streams_to_the_same_split_and_failures(bad, tmp_path):
    train, _ = bad
    (tmp_path / "data").mkdir()
    train.to_csv(tmp_path / "data" / "all.csv", index=False)
    cfg = DatasetConfig(path="data", file="all.csv", test_fraction=0.25)
    one = validate_table(EXP, FEATURES, "label", load_frames(cfg, tmp_path, 0, True), tmp_path / "one",
                         class_label=True)
    plan = ValidationPlan("validation.suite", [tmp_path / "data" / "all.csv"],
                          _params(cfg, tmp_path, stream_above_bytes=0))
    many = run_plan(plan, tmp_path / "many")
    assert many["rows"] == one["rows"] and sum(many["rows"].values()) == 1000
    assert many["failures"] == one["failures"] and many["n_failed"] >= 3
    # The CSV's whole-number columns were read as float64 and are reported as integers.
    schema = json.loads((tmp_path / "many" / "gx_result.json").read_text())["validations"]["train_schema"]
    assert all(r["success"] for r in schema["results"])


def test_a_wholly_bad_column_keeps_its_exact_count_when_its_cell_list_is_cut(tmp_path):
    train, test = _table(2400, 3), _table(300, 4)
    train["x0"] = -2.0  # 2400 failing cells: more than the 1000 a merged result lists per column
    (tmp_path / "data").mkdir()
    train.to_parquet(tmp_path / "data" / "train.parquet", row_group_size=500)
    test.to_parquet(tmp_path / "data" / "test.parquet")
    cfg = DatasetConfig(path="data", train_file="train.parquet", test_file="test.parquet")
    one = validate_table(EXP, FEATURES, "label", load_frames(cfg, tmp_path, 0, True), tmp_path / "one",
                         class_label=True)
    many = validate(_params(cfg, tmp_path, batch_rows=500, stream_above_bytes=0), tmp_path / "many")
    assert many["failures"] == one["failures"]
    below = [f for f in many["failures"] if f["check"] == "range"]
    assert [(f["column"], f["unexpected_count"], f["rows"]) for f in below] == [("x0", 2400, [0, 1, 2, 3, 4])]
