"""Real Great Expectations runs: the bundled digits data against configs/digits.expectations.yaml,
a generated float table against expectations written for it, broken copies of both, and the
text corpus suite."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from core.config import DatasetConfig
from tasks.lm_options import TextConfig, TextExpectations
from core.expectations import ColumnExpectation, TableExpectations, load_expectations
from tasks.table import feature_columns, load_frames
from tests.tables import validate_table

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cfg():
    return DatasetConfig(path="data/digits", train_file="train.csv", test_file="test.csv", label="label",
                         expectations_file="configs/digits.expectations.yaml")


@pytest.fixture(scope="module")
def exp(cfg, repo_root):
    return load_expectations(repo_root / cfg.expectations_file)


@pytest.fixture(scope="module")
def splits(cfg, repo_root, bundled_data):
    return load_frames(cfg, repo_root, seed=0, stratify=True)


@pytest.fixture(scope="module")
def features(cfg, splits):
    return feature_columns(cfg, list(splits["train"].columns))


@pytest.fixture
def data(splits):
    """Fresh copies to break."""
    return {name: df.copy() for name, df in splits.items()}


@pytest.fixture
def validate(exp, features, tmp_path):
    """validate_table on the digits expectations, classification."""
    def run(frames, expectations=None):
        return validate_table(expectations or exp, features, "label", frames, tmp_path, class_label=True)
    return run


def only_failure(report: dict) -> dict:
    assert report["success"] is False
    assert report["n_failed"] == len(report["failures"]) == 1, report["failures"]
    return report["failures"][0]


def test_bundled_data_passes_and_writes_every_report_file(exp, features, splits, tmp_path):
    report = validate_table(exp, features, "label", splits, tmp_path, class_label=True)

    assert report["success"] is True, report["failures"]
    assert report["n_failed"] == 0 and report["failures"] == [] and report["skipped"] == []
    # Per split: columns, label exists, row count, label set; 65 types + 64 numeric features;
    # 65 not-null + 64 min + 64 max cells; balance. Plus the cross-split check.
    assert report["n_expectations"] == 2 * (4 + 65 + 64 + 65 + 64 + 64 + 1) + 1 == 655
    assert report["gx"]["expectations"] == 21 and report["gx"]["failed"] == 0
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
    assert sum(len(v["results"]) for v in gx_doc["validations"].values()) == 21

    assert Path(files["summary_md"]).read_text().startswith("# Data validation PASSED")
    assert files["data_docs"] == str((tmp_path / "data_docs" / "index.html").resolve())
    index = Path(files["data_docs"]).read_text()
    assert "trainflow_train_cells" in index and "trainflow_cross" in index
    assert not (tmp_path / "data_docs" / "expectations").exists()  # validation pages only
    # The stacked expectations show the user's column names and bounds, not just "value".
    pages = "".join(p.read_text() for p in (tmp_path / "data_docs").rglob("*.html") if "train_cells" in str(p))
    assert "pixel_0 … pixel_63" in pages and "max 16" in pages


def test_a_null_is_reported_once_as_a_null(data, validate):
    # The null turns pixel_20 into float64; it must not also fail the type check.
    data["train"].loc[17, "pixel_20"] = None
    f = only_failure(validate(data))
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"]) == (
        "train", "expect_column_values_to_not_be_null", "pixel_20", 1,
    )
    assert f["rows"] == [17]


def test_a_null_label_is_named(data, validate):
    data["test"].loc[3, "label"] = None
    f = only_failure(validate(data))
    assert (f["split"], f["expectation"], f["column"], f["unexpected_count"], f["rows"]) == (
        "test", "expect_column_values_to_not_be_null", "label", 1, [3],
    )


def test_an_out_of_range_pixel_is_named_with_its_value(data, validate):
    data["test"].loc[5, "pixel_30"] = 99
    report = validate(data)
    f = only_failure(report)
    assert (f["split"], f["check"], f["column"], f["unexpected_count"], f["examples"], f["rows"]) == (
        "test", "range", "pixel_30", 1, [99], [5],
    )
    assert f["detail"] == "1 value above max 16: 99 ×1 (row 5)"
    assert f["message"] == "test.pixel_30: 1 value above max 16: 99 ×1 (row 5)"
    summary = Path(report["files"]["summary_md"]).read_text()
    assert summary.startswith("# Data validation FAILED")
    assert "| test | range | `expect_column_pair_values_a_to_be_greater_than_b` | pixel_30 | 1 | 99 |" in summary


def test_a_bad_label_is_named(data, validate):
    data["train"].loc[9, "label"] = 12
    f = only_failure(validate(data))
    assert (f["split"], f["check"], f["expectation"], f["column"], f["unexpected_count"], f["examples"]) == (
        "train", "label_set", "expect_column_values_to_be_in_set", "label", 1, [12],
    )
    assert f["detail"].startswith("1 value not in the class set {0..9}: 12 ×1")


def test_several_bad_cells_give_exact_counts_per_column(data, validate):
    train = data["train"]
    train.loc[[1, 2, 3], "pixel_0"] = 17
    train.loc[4, "pixel_63"] = -1
    report = validate(data)
    got = {(f["column"], f["unexpected_count"], f["detail"].split(" (")[0]) for f in report["failures"]}
    assert got == {("pixel_0", 3, "3 values above max 16: 17 ×3"), ("pixel_63", 1, "1 value below min 0: -1 ×1")}
    assert report["gx"]["failed"] == 2  # the stacked min and max expectations


def test_each_column_is_held_to_its_own_bounds(exp, data, validate):
    # pixel_5 may only reach 8 in these expectations: 9 is fine for every other pixel, not for it.
    cols = [c.model_copy(update={"max": 8.0}) if c.name == "pixel_5" else c for c in exp.columns]
    tight = exp.model_copy(update={"columns": cols})
    data["train"]["pixel_5"] = data["train"]["pixel_5"].clip(upper=8)
    data["test"]["pixel_5"] = data["test"]["pixel_5"].clip(upper=8)
    assert validate(data, tight)["success"] is True
    data["train"].loc[[10, 11], "pixel_5"] = 9
    data["train"].loc[10, "pixel_6"] = 9
    f = only_failure(validate(data, tight))
    assert (f["split"], f["check"], f["column"], f["unexpected_count"], f["rows"]) == (
        "train", "range", "pixel_5", 2, [10, 11],
    )
    assert f["detail"] == "2 values above max 8: 9 ×2 (rows 10, 11)"


def test_a_test_row_copied_into_train_is_a_leak(data, validate):
    import pandas as pd

    n_train = len(data["train"])
    data["train"] = pd.concat([data["train"], data["test"].iloc[[7]]], ignore_index=True)
    f = only_failure(validate(data))
    assert (f["split"], f["expectation"], f["column"]) == ("cross", "expect_column_values_to_be_unique", None)
    assert f["examples"] == [{"train_row": n_train, "test_row": 7}]
    assert f["detail"].startswith("1 row of test also in train")


def test_a_row_duplicated_within_one_split_is_not_a_leak(data, validate):
    import pandas as pd

    data["train"] = pd.concat([data["train"], data["train"].iloc[[0]]], ignore_index=True)
    assert validate(data)["success"] is True


def test_a_dropped_class_fails_class_balance(data, validate):
    train = data["train"]
    data["train"] = train[train["label"] != 4].reset_index(drop=True)
    report = validate(data)
    balance = [f for f in report["failures"] if f["check"] == "class_balance"]
    assert len(balance) == 1, report["failures"]
    f = balance[0]
    assert (f["split"], f["expectation"], f["column"]) == ("train", "expect_column_values_to_be_between", "label")
    assert {"label": 4, "fraction": 0.0} in f["examples"]
    assert report["success"] is False


def test_a_header_that_does_not_match_lists_expected_and_found(data, validate):
    data["test"] = data["test"].rename(columns={"pixel_10": "pixel_x"})
    report = validate(data)
    f = [x for x in report["failures"] if x["check"] == "columns"]
    assert len(f) == 1 and f[0]["split"] == "test"
    assert f[0]["examples"] == ["pixel_10", "pixel_x"]
    assert f[0]["detail"] == "65 columns, expected 65: missing pixel_10; unexpected pixel_x"


def test_strings_missing_columns_and_wrong_order_are_reported_not_raised(data, validate):
    train, test = data["train"], data["test"]
    train["pixel_7"] = train["pixel_7"].astype(str)
    train.loc[2, "pixel_7"] = "abc"
    train["pixel_8"] = train["pixel_8"] + 0.5
    data["train"] = train.drop(columns=["pixel_10"])
    data["test"] = test[list(reversed(test.columns))]

    report = validate(data)
    json.dumps(report, allow_nan=False)
    by_check = {(f["split"], f["check"]): f for f in report["failures"]}
    assert "pixel_10" in by_check[("train", "columns")]["examples"]
    assert "out of order" in by_check[("test", "columns")]["detail"]
    dtype = by_check[("train", "dtype")]
    assert dtype["expectation"] == "expect_column_pair_values_to_be_in_set"
    shown = {(e["column"], e["found"], e["expected"]) for e in dtype["examples"]}
    assert shown == {("pixel_7", "string", "integer"), ("pixel_8", "float", "integer")}
    # Text is a feature type a model takes (as categories): the wrong type is the failure, not the kind.
    assert ("train", "feature_type") not in by_check
    assert {"split": "train", "check": "range", "reason": "not numeric: pixel_7"} in report["skipped"]


def test_a_missing_label_column_is_a_failure_naming_it(data, validate):
    data["test"] = data["test"].drop(columns=["label"])
    report = validate(data)
    assert [(f["split"], f["check"], f["column"]) for f in report["failures"]] == [
        ("test", "columns", None), ("test", "label_column", "label"),
    ]
    assert report["failures"][1]["detail"] == "no label column 'label'"
    assert report["skipped"] == [
        {"split": "test", "check": "nulls, label_set, class_balance", "reason": "no 'label' column"}
    ]


def test_gx_raising_on_a_frame_becomes_failures(exp, features, splits, tmp_path, monkeypatch, caplog):
    import great_expectations as gx

    original = gx.ValidationDefinition.run

    def run(self, **kwargs):
        if self.name == "trainflow_test_cells":
            raise RuntimeError("boom")
        return original(self, **kwargs)

    monkeypatch.setattr(gx.ValidationDefinition, "run", run)
    with caplog.at_level(logging.WARNING, logger="validation.gx_run"):
        report = validate_table(exp, features, "label", splits, tmp_path, class_label=True)
    assert report["success"] is False
    assert [(f["split"], f["check"], f["column"]) for f in report["failures"]] == [
        ("test", "nulls", None), ("test", "range", None), ("test", "range", None),
    ]
    assert all(f["detail"] == "could not be evaluated: RuntimeError: boom" for f in report["failures"])
    assert "GX could not validate test_cells" in caplog.text


def test_a_data_docs_failure_is_a_warning_not_an_error(exp, features, splits, tmp_path, monkeypatch, caplog):
    from great_expectations.data_context.data_context.abstract_data_context import AbstractDataContext

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(AbstractDataContext, "build_data_docs", broken)
    with caplog.at_level(logging.WARNING, logger="validation.gx_run"):
        report = validate_table(exp, features, "label", splits, tmp_path, class_label=True)
    assert report["success"] is True
    assert report["files"]["data_docs"] is None
    assert "Data Docs were not built (OSError: disk full)" in caplog.text
    assert Path(report["files"]["result_json"]).is_file()
    assert "- data_docs: not built" in Path(report["files"]["summary_md"]).read_text()


# --------------------------------------------------------------------------- a float table

WINE_BOUNDS = {  # name: (type, min, max) - columns of very different scales
    "alcohol": ("float", 11.0, 15.0),
    "malic_acid": ("float", 0.7, 5.8),
    "magnesium": ("integer", 70, 162),
    "hue": ("float", 0.48, 1.71),
    "proline": ("float", 278.0, 1680.0),
}
WINE_CLASSES = ["class_0", "class_1", "class_2"]


@pytest.fixture(scope="module")
def wine(tmp_path_factory):
    """A wine-like table in one CSV (split by seed), its config and its reviewed expectations."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    n = 150
    cols = {}
    for name, (kind, lo, hi) in WINE_BOUNDS.items():
        v = rng.uniform(lo, hi, n)
        cols[name] = np.round(v).astype("int64") if kind == "integer" else np.round(v, 3)
    cols["target"] = np.array(WINE_CLASSES)[np.arange(n) % 3]
    root = tmp_path_factory.mktemp("wine")
    pd.DataFrame(cols).to_csv(root / "wine.csv", index=False)
    cfg = DatasetConfig(path=".", file="wine.csv", test_fraction=0.2, label="target")
    exp = TableExpectations(
        label="target",
        columns=[ColumnExpectation(name=k, type=t, min=lo, max=hi) for k, (t, lo, hi) in WINE_BOUNDS.items()]
        + [ColumnExpectation(name="target", type="string", values=WINE_CLASSES)],
        rows={"train": (100, 140), "test": (20, 40)},
        class_share=(0.25, 0.42),
    )
    frames = load_frames(cfg, root, seed=0, stratify=True)
    return exp, feature_columns(cfg, list(frames["train"].columns)), frames


@pytest.fixture
def wine_data(wine):
    exp, features, frames = wine
    return {k: v.copy() for k, v in frames.items()}


def validate_wine(wine, frames, tmp_path):
    exp, features, _ = wine
    return validate_table(exp, features, "target", frames, tmp_path, class_label=True)


def test_a_float_table_passes_expectations_written_for_it(wine, tmp_path):
    exp, features, frames = wine
    assert features == list(WINE_BOUNDS)
    report = validate_wine(wine, frames, tmp_path)
    assert report["success"] is True, (report["failures"], report["skipped"])
    assert report["rows"] == {"train": 120, "test": 30}


def test_a_value_fine_for_one_column_is_caught_in_another(wine, wine_data, tmp_path):
    # 500 is a normal proline, far above alcohol's max 15.
    wine_data["test"].loc[4, "alcohol"] = 500.0
    f = only_failure(validate_wine(wine, wine_data, tmp_path))
    assert (f["split"], f["check"], f["column"], f["unexpected_count"], f["examples"], f["rows"]) == (
        "test", "range", "alcohol", 1, [500], [4],
    )
    assert f["detail"] == "1 value above max 15: 500 ×1 (row 4)"


def test_text_in_a_numeric_feature_is_named_as_the_wrong_type(wine, wine_data, tmp_path):
    wine_data["train"]["hue"] = "pale"
    report = validate_wine(wine, wine_data, tmp_path)
    by_check = {(f["split"], f["check"]): f for f in report["failures"]}
    dtype = by_check[("train", "dtype")]
    assert dtype["column"] == "hue" and dtype["message"] == "train.hue: 1 column of the wrong type: hue holds " \
        "string (str), expected float"
    assert report["success"] is False


def test_a_feature_of_no_kind_a_model_takes_is_named(wine, wine_data, tmp_path):
    wine_data["train"]["hue"] = [1.5 if i % 2 else "pale" for i in range(len(wine_data["train"]))]
    report = validate_wine(wine, wine_data, tmp_path)
    by_check = {(f["split"], f["check"]): f for f in report["failures"]}
    kind = by_check[("train", "feature_type")]
    assert kind["column"] == "hue" and "hue is object" in kind["detail"]


def test_a_label_outside_the_class_set_is_named(wine, wine_data, tmp_path):
    wine_data["test"].loc[[2, 3], "target"] = "class_9"
    f = only_failure(validate_wine(wine, wine_data, tmp_path))
    assert (f["split"], f["check"], f["column"], f["unexpected_count"], f["examples"], f["rows"]) == (
        "test", "label_set", "target", 2, ["class_9", "class_9"], [2, 3],
    )
    assert "not in the class set {class_0, class_1, class_2}" in f["detail"]


def test_a_regression_table_has_no_class_checks(wine, tmp_path):
    exp, features, frames = wine
    y = {k: v.assign(target=v["magnesium"] * 0.5).drop(columns=["magnesium"]) for k, v in frames.items()}
    cols = [c for c in exp.columns if c.name not in ("magnesium", "target")]
    target = ColumnExpectation(name="target", type="float", min=0, max=100)
    reg = TableExpectations(label="target", columns=[*cols, target], rows=exp.rows)
    feats = [c.name for c in cols]
    report = validate_table(reg, feats, "target", y, tmp_path, class_label=False)
    assert report["success"] is True, report["failures"]
    validations = json.loads(Path(report["files"]["result_json"]).read_text())["validations"]
    assert not any("balance" in name for name in validations)


# --------------------------------------------------------------------------- the text corpus suite


def _line(path: str, text: str) -> bytes:
    return json.dumps({"path": path, "text": text}).encode()


def test_text_suite_names_every_broken_document(tmp_path):
    from validation import text_suite
    from validation.gx_run import validate
    from validation.text_suite import document_frame

    ds = DatasetConfig(path="data-stdlib", text=TextConfig(expectations=TextExpectations(
        doc_bytes=(1, 50), train_docs=(40, 80), eval_docs=(4, 20))))
    train = [_line("a.py", "print(1)"), _line("b.py", " \n "), b'{"path": "c.py", "text": "caf\xff"}',
             _line("d.py", "x" * 60), _line("e.py", "ok = 1"), b"not json"]
    evals = [_line("a.py", "other = 2"), _line("f.py", "print(1)")]
    splits = {"train": document_frame(train), "eval": document_frame(evals)}
    report = validate(text_suite, {"dataset": ds}, splits, tmp_path)
    assert not report["success"]
    got = {(f["split"], f["check"], f["column"]): f for f in report["failures"]}
    assert set(got) == {
        ("train", "row_count", None),
        ("train", "format", "parsed"), ("train", "utf8", "utf8"), ("train", "empty", "nonblank"),
        ("train", "length", "n_bytes"), ("eval", "row_count", None),
        ("cross", "leak", "path"), ("cross", "leak", "sha256"),
    }
    assert got[("train", "length", "n_bytes")]["examples"] == [{"line": 4, "path": "d.py", "n_bytes": 60}]
    assert "train a.py = eval a.py" in got[("cross", "leak", "path")]["detail"]
    assert report["n_failed"] == len(report["failures"]) == 8
    assert report["n_expectations"] == 14 and report["gx"]["failed"] == 8
    assert "| train | utf8 |" in (tmp_path / "summary.md").read_text()
    assert Path(report["files"]["data_docs"]).is_file()


def test_values_of_a_date_column_that_are_not_dates_are_named_with_their_rows(tmp_path):
    """The expectations init writes for a dated table, and the suite's date check: a value that is
    not a date in the column's format (``dataset.dates``) is named with its row; a missing one is not."""
    from tests.tables import hotels
    from validation.profile import profile_table

    df = hotels(200)
    splits = {"train": df.iloc[:160].reset_index(drop=True), "test": df.iloc[160:].reset_index(drop=True)}
    dates = {"arrival_date": "%Y-%m-%d", "booked_at": "%Y-%m-%d %H:%M"}
    exp = profile_table(splits, "price", False, dates=tuple(dates))
    assert exp.column("arrival_date").values is None  # new dates are no new categories
    features = ["arrival_date", "booked_at", "room", "nights"]
    assert validate_table(exp, features, "price", splits, tmp_path / "ok", False, dates)["success"]
    bad = {k: v.copy() for k, v in splits.items()}
    bad["train"].loc[[10, 11], "arrival_date"] = ["2016-02-30", "next week"]
    bad["test"].loc[3, "booked_at"] = "2016-07-01"  # a date without the hour its column has
    report = validate_table(exp, features, "price", bad, tmp_path / "bad", False, dates)
    found = {f["message"] for f in report["failures"] if f["check"] == "date_format"}
    assert found == {"train.arrival_date: 2 values not a date of format '%Y-%m-%d': 2016-02-30 ×1, next week ×1 "
                     "(rows 10, 11)",
                     "test.booked_at: 1 value not a date of format '%Y-%m-%d %H:%M': 2016-07-01 ×1 (row 3)"}, found
