"""Real Great Expectations runs on the bundled digits data and on broken copies of it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from core.config import load_config
from validation import load_splits, validate_dataset

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cfg(repo_root):
    return load_config(repo_root / "configs" / "digits.yaml").dataset


@pytest.fixture(scope="module")
def splits(cfg, repo_root, bundled_data):
    return load_splits(cfg, repo_root)


@pytest.fixture
def data(splits):
    """Fresh copies to break."""
    return {name: df.copy() for name, df in splits.items()}


def only_failure(report: dict) -> dict:
    assert report["success"] is False
    assert report["n_failed"] == len(report["failures"]) == 1, report["failures"]
    return report["failures"][0]


def test_bundled_data_passes_and_writes_every_report_file(cfg, splits, tmp_path):
    report = validate_dataset(cfg, splits, tmp_path)

    assert report["success"] is True, report["failures"]
    assert report["n_failed"] == 0 and report["failures"] == [] and report["skipped"] == []
    # Per split: columns, row count, label not-null and set, dtypes, 64 x (nulls, range), balance;
    # plus the cross-split check.
    assert report["n_expectations"] == 2 * (4 + 1 + 2 * 64 + 1) + 1 == 269
    assert report["gx"]["expectations"] == 17 and report["gx"]["failed"] == 0
    assert report["rows"] == {"train": len(splits["train"]), "test": len(splits["test"])}
    json.dumps(report, allow_nan=False)

    files = report["files"]
    assert files["result_json"] == str(tmp_path / "gx_result.json")
    gx_doc = json.loads(Path(files["result_json"]).read_text())
    assert gx_doc["success"] is True
    assert set(gx_doc["validations"]) == {
        "train", "train_schema", "train_cells", "train_balance",
        "test", "test_schema", "test_cells", "test_balance", "cross",
    }
    assert sum(len(v["results"]) for v in gx_doc["validations"].values()) == 17

    assert Path(files["summary_md"]).read_text().startswith("# Data validation PASSED")
    assert files["data_docs"] == str((tmp_path / "data_docs" / "index.html").resolve())
    index = Path(files["data_docs"]).read_text()
    assert "trainflow_train_cells" in index and "trainflow_cross" in index
    assert not (tmp_path / "data_docs" / "expectations").exists()  # validation pages only


def test_a_null_is_reported_once_as_a_null(cfg, data, tmp_path):
    # The null turns pixel_20 into float64; it must not also fail the dtype check.
    data["train"].loc[17, "pixel_20"] = None
    f = only_failure(validate_dataset(cfg, data, tmp_path))
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"]) == (
        "train", "expect_column_values_to_not_be_null", "pixel_20", 1,
    )
    assert f["rows"] == [17]


def test_a_null_label_is_named(cfg, data, tmp_path):
    data["test"].loc[3, "label"] = None
    report = validate_dataset(cfg, data, tmp_path)
    f = only_failure(report)
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"], f["rows"]) == (
        "test", "expect_column_values_to_not_be_null", "label", 1, [3],
    )


def test_an_out_of_range_pixel_is_named_with_its_value(cfg, data, tmp_path):
    data["test"].loc[5, "pixel_30"] = 99
    report = validate_dataset(cfg, data, tmp_path)
    f = only_failure(report)
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"], f["examples"], f["rows"]) == (
        "test", "expect_column_values_to_be_between", "pixel_30", 1, [99], [5],
    )
    summary = Path(report["files"]["summary_md"]).read_text()
    assert summary.startswith("# Data validation FAILED")
    assert "| test | range | `expect_column_values_to_be_between` | pixel_30 | 1 | 99 |" in summary


def test_a_bad_label_is_named(cfg, data, tmp_path):
    data["train"].loc[9, "label"] = 12
    f = only_failure(validate_dataset(cfg, data, tmp_path))
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"], f["examples"]) == (
        "train", "expect_column_values_to_be_in_set", "label", 1, [12],
    )


def test_several_bad_cells_give_exact_counts_per_column(cfg, data, tmp_path):
    train = data["train"]
    train.loc[[1, 2, 3], "pixel_0"] = 17
    train.loc[4, "pixel_63"] = -1
    report = validate_dataset(cfg, data, tmp_path)
    got = {(f["column"], f["unexpected_count"]) for f in report["failures"]}
    assert got == {("pixel_0", 3), ("pixel_63", 1)}
    assert report["gx"]["failed"] == 1  # one stacked GX expectation, two failing columns


def test_a_test_row_copied_into_train_is_a_leak(cfg, data, tmp_path):
    import pandas as pd

    n_train = len(data["train"])
    data["train"] = pd.concat([data["train"], data["test"].iloc[[7]]], ignore_index=True)
    f = only_failure(validate_dataset(cfg, data, tmp_path))
    assert (f["split"], f["expectation"], f["column"]) == ("cross", "expect_column_values_to_be_unique", None)
    assert f["examples"] == [{"train_row": n_train, "test_row": 7}]
    assert f["detail"].startswith("1 row of test also in train")


def test_a_row_duplicated_within_one_split_is_not_a_leak(cfg, data, tmp_path):
    import pandas as pd

    data["train"] = pd.concat([data["train"], data["train"].iloc[[0]]], ignore_index=True)
    assert validate_dataset(cfg, data, tmp_path)["success"] is True


def test_a_dropped_class_fails_class_balance(cfg, data, tmp_path):
    train = data["train"]
    data["train"] = train[train["label"] != 4].reset_index(drop=True)
    report = validate_dataset(cfg, data, tmp_path)
    balance = [f for f in report["failures"] if f["check"] == "class_balance"]
    assert len(balance) == 1, report["failures"]
    f = balance[0]
    assert (f["split"], f["expectation"], f["column"]) == ("train", "expect_column_values_to_be_between", "label")
    assert {"label": 4, "fraction": 0.0} in f["examples"]
    assert report["success"] is False


def test_strings_missing_columns_and_wrong_order_are_reported_not_raised(cfg, data, tmp_path):
    train, test = data["train"], data["test"]
    train["pixel_7"] = train["pixel_7"].astype(str)
    train.loc[2, "pixel_7"] = "abc"
    train["pixel_8"] = train["pixel_8"] + 0.5
    data["train"] = train.drop(columns=["pixel_10"])
    data["test"] = test[list(reversed(test.columns))]

    report = validate_dataset(cfg, data, tmp_path)
    json.dumps(report, allow_nan=False)
    by_check = {(f["split"], f["check"]): f for f in report["failures"]}
    assert "pixel_10" in by_check[("train", "columns")]["examples"]
    assert "out of order" in by_check[("test", "columns")]["detail"]
    dtype = by_check[("train", "dtype")]
    assert dtype["expectation"] == "expect_column_values_to_be_in_set"
    assert {"column": "pixel_7", "dtype": "str"} in dtype["examples"]
    assert {"column": "pixel_8", "dtype": "float64"} in dtype["examples"]
    assert {"split": "train", "check": "nulls, range", "reason": "not numeric: pixel_7"} in report["skipped"]


def test_missing_label_column_skips_label_checks(cfg, data, tmp_path):
    data["test"] = data["test"].drop(columns=["label"])
    report = validate_dataset(cfg, data, tmp_path)
    assert [(f["split"], f["check"]) for f in report["failures"]] == [("test", "columns")]
    assert report["skipped"] == [
        {"split": "test", "check": "nulls, label_set, class_balance", "reason": "no 'label' column"}
    ]


def test_gx_raising_on_a_frame_becomes_failures(cfg, splits, tmp_path, monkeypatch, caplog):
    import great_expectations as gx

    original = gx.ValidationDefinition.run

    def run(self, **kwargs):
        if self.name == "trainflow_test_cells":
            raise RuntimeError("boom")
        return original(self, **kwargs)

    monkeypatch.setattr(gx.ValidationDefinition, "run", run)
    with caplog.at_level(logging.WARNING, logger="validation.suite"):
        report = validate_dataset(cfg, splits, tmp_path)
    assert report["success"] is False
    assert [(f["split"], f["check"], f["column"]) for f in report["failures"]] == [
        ("test", "nulls", None),
        ("test", "range", None),
    ]
    assert all(f["detail"] == "could not be evaluated: RuntimeError: boom" for f in report["failures"])
    assert "GX could not validate test_cells" in caplog.text


def test_a_data_docs_failure_is_a_warning_not_an_error(cfg, splits, tmp_path, monkeypatch, caplog):
    from great_expectations.data_context.data_context.abstract_data_context import AbstractDataContext

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(AbstractDataContext, "build_data_docs", broken)
    with caplog.at_level(logging.WARNING, logger="validation.suite"):
        report = validate_dataset(cfg, splits, tmp_path)
    assert report["success"] is True
    assert report["files"]["data_docs"] is None
    assert "Data Docs were not built (OSError: disk full)" in caplog.text
    assert Path(report["files"]["result_json"]).is_file()
    assert "- data_docs: not built" in Path(report["files"]["summary_md"]).read_text()
