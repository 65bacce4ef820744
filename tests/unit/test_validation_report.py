"""validation.report (pure: hand-written GX result dicts, no GX run) and the suite's hashes."""

from __future__ import annotations

import json
import math

import pytest

from core.errors import DataUnavailableError
from core.expectations import ColumnExpectation, TableExpectations
from validation.gx_run import data_hash as table_data_hash
from validation.gx_run import suite_key
from validation.report import (
    cells_failures,
    failure_from_result,
    failures_from_results,
    index_records,
    jsonable,
    sort_failures,
    summary_markdown,
)



def evr(etype: str, kwargs: dict, result: dict, success: bool = False, exception: dict | None = None) -> dict:
    """An ExpectationValidationResult as ``to_json_dict()`` gives it."""
    return {
        "success": success,
        "expectation_config": {"type": etype, "kwargs": kwargs, "meta": {}},
        "result": result,
        "exception_info": exception
        or {"raised_exception": False, "exception_traceback": None, "exception_message": None},
    }


NULL_FAILURE = {
    "split": "train",
    "check": "nulls",
    "expectation": "expect_column_values_to_not_be_null",
    "column": "pixel_5",
    "unexpected_count": 2,
    "examples": ["row 3", "row 9"],
    "rows": [3, 9],
    "detail": "2 null values (rows 3, 9)",
}


def report_with(failures: list[dict], **extra) -> dict:
    return {
        "success": not failures,
        "n_expectations": 269,
        "n_failed": len(failures),
        "failures": failures,
        "duration_s": 0.61,
        "files": {"result_json": "/r/gx_result.json", "summary_md": "/r/summary.md", "data_docs": None},
        "gx": {"version": "1.24.1", "expectations": 17, "failed": len(failures)},
        **extra,
    }


# ----------------------------------------------------------------------------- summary_markdown


def test_summary_of_a_passing_report_has_a_passed_headline_and_no_table():
    md = summary_markdown(report_with([]))
    assert md.splitlines()[0] == "# Data validation PASSED"
    assert "269 of 269 checks passed, 0 failed" in md
    assert "17 GX expectations" in md
    assert "| split |" not in md
    assert "- data_docs: not built" in md


def test_summary_of_a_failing_report_tables_every_failure():
    leak = {
        "split": "cross",
        "check": "leak",
        "expectation": "expect_column_values_to_be_unique",
        "column": None,
        "unexpected_count": 2,
        "examples": [{"train_row": 1438, "test_row": 5}],
        "rows": [],
        "detail": "1 row of test also in train: train[1438] = test[5]",
    }
    md = summary_markdown(report_with([NULL_FAILURE, leak]))
    lines = md.splitlines()
    assert lines[0] == "# Data validation FAILED"
    assert "267 of 269 checks passed, 2 failed" in md
    header = lines.index("| split | check | expectation | column | unexpected | examples | detail |")
    rows = lines[header + 2 : header + 4]
    assert rows[0] == (
        "| train | nulls | `expect_column_values_to_not_be_null` | pixel_5 | 2 "
        "| row 3; row 9 | 2 null values (rows 3, 9) |"
    )
    # No column and dict examples render readably.
    assert rows[1].startswith("| cross | leak | `expect_column_values_to_be_unique` | — | 2 |")
    assert "{train_row: 1438, test_row: 5}" in rows[1]


def test_summary_escapes_pipes_and_truncates_long_examples():
    failure = dict(NULL_FAILURE, detail="a|b", examples=["x" * 100])
    row = [line for line in summary_markdown(report_with([failure])).splitlines() if "pixel_5" in line][0]
    assert "a\\|b" in row
    assert "x" * 39 + "…" in row and "x" * 41 not in row
    # Seven cells: the escaped pipe did not add one.
    assert row.count(" | ") == 6


def test_summary_lists_skipped_checks():
    md = summary_markdown(
        report_with([NULL_FAILURE], skipped=[{"split": "train", "check": "class_balance", "reason": "no 'label' column"}])
    )
    assert "## Checks not run" in md
    assert "- train: class_balance: no 'label' column" in md


# ----------------------------------------------------------------------------- failure extraction


def test_null_failure_names_column_count_and_rows():
    f = failure_from_result(
        evr(
            "expect_column_values_to_not_be_null",
            {"column": "label"},
            {"element_count": 1438, "unexpected_count": 1, "partial_unexpected_list": [None],
             "partial_unexpected_index_list": [12]},
        ),
        "train",
    )
    assert f == {
        "split": "train",
        "check": "nulls",
        "expectation": "expect_column_values_to_not_be_null",
        "column": "label",
        "unexpected_count": 1,
        "examples": ["row 12"],
        "rows": [12],
        "detail": "1 null value (row 12)",
        "message": "train.label: 1 null value (row 12)",
    }


def test_label_set_failure_shows_values_and_the_class_range():
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_in_set",
            {"column": "label", "value_set": list(range(10))},
            {"unexpected_count": 7, "partial_unexpected_list": [12, 12, 11, 15, 12],
             "partial_unexpected_index_list": [9, 10, 11, 12, 13]},
        ),
        "test",
    )
    assert (f["check"], f["column"], f["unexpected_count"], f["examples"]) == ("label_set", "label", 7, [12, 12, 11, 15, 12])
    # Without GX's counts, the examples are counted (most frequent first).
    assert f["detail"] == "7 values not in the class set {0..9}: 12 ×3, 11 ×1, 15 ×1 (rows 9, 10, 11, 12, 13 ...)"
    assert f["message"] == "test.label: " + f["detail"]


def test_a_value_set_failure_names_split_column_the_set_and_each_value_with_its_count():
    """The issue's own example: a person reads what is wrong, where, and how often."""
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_in_set",
            {"column": "sex", "value_set": ["female", "male"]},
            {"unexpected_count": 11, "partial_unexpected_list": ["F", "unknown", "F", "F", "unknown"],
             "partial_unexpected_counts": [{"value": "unknown", "count": 8}, {"value": "F", "count": 3}],
             "partial_unexpected_index_list": [3, 5, 8, 13, 21]},
        ),
        "train",
    )
    assert f["message"] == "train.sex: 11 values not in {female, male}: unknown ×8, F ×3 (rows 3, 5, 8, 13, 21 ...)"

    other = failure_from_result(
        evr("expect_column_values_to_be_in_set", {"column": "colour", "value_set": ["red", "white"]},
            {"unexpected_count": 1, "partial_unexpected_list": ["rose"], "partial_unexpected_index_list": [4]}),
        "train",
    )
    assert (other["check"], other["column"]) == ("value_set", "colour")
    assert other["detail"] == "1 value not in {red, white}: rose ×1 (row 4)"


def test_a_missing_label_column_names_it():
    f = failure_from_result(
        evr("expect_column_to_exist", {"column": "target"}, {}), "test", label_column="target")
    assert (f["check"], f["column"], f["examples"], f["detail"]) == (
        "label_column", "target", ["target"], "no label column 'target'")


def test_row_count_and_column_list_failures_are_table_level():
    rc = failure_from_result(
        evr("expect_table_row_count_to_be_between", {"min_value": 1000, "max_value": 2000}, {"observed_value": 12}),
        "train",
    )
    assert (rc["check"], rc["column"], rc["unexpected_count"], rc["examples"]) == ("row_count", None, None, [12])
    assert rc["detail"] == "12 rows, expected 1000..2000"

    cols = failure_from_result(
        evr("expect_table_columns_to_match_ordered_list", {"column_list": ["a", "b", "c"]}, {"observed_value": ["a", "c", "x"]}),
        "test",
    )
    assert cols["check"] == "columns" and cols["column"] is None
    assert cols["examples"] == ["b", "x"]
    assert cols["detail"] == "3 columns, expected 3: missing b; unexpected x"

    order = failure_from_result(
        evr("expect_table_columns_to_match_ordered_list", {"column_list": ["a", "b", "c"]}, {"observed_value": ["a", "c", "b"]}),
        "test",
    )
    assert "out of order" in order["detail"] and order["examples"] == ["c", "b"]


def test_schema_failure_names_each_bad_column_with_expected_and_found_type():
    f = failure_from_result(
        evr(
            "expect_column_pair_values_to_be_in_set",
            {"column_A": "expected", "column_B": "found", "value_pairs_set": [["integer", "integer"]]},
            {"unexpected_count": 1,
             "unexpected_index_list": [{"column": ["pixel_7"], "dtype": ["str"], "expected": ["integer"],
                                        "found": ["string"]}]},  # dict of lists
        ),
        "train",
        "schema",
    )
    assert (f["check"], f["column"], f["unexpected_count"]) == ("dtype", "pixel_7", 1)
    assert f["examples"] == [{"column": "pixel_7", "dtype": "str", "expected": "integer", "found": "string"}]
    assert f["detail"] == "1 column of the wrong type: pixel_7 holds string (str), expected integer"


def test_a_non_numeric_feature_is_named_with_its_dtype():
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_in_set",
            {"column": "feature", "value_set": ["integer", "float", "string", "boolean", "null"]},
            {"unexpected_count": 2,
             "unexpected_index_list": [{"column": ["hue", "when"], "dtype": ["object", "datetime64[us]"],
                                        "expected": ["float", "string"], "found": ["other", "other"]}]},
        ),
        "test",
        "schema",
    )
    assert (f["check"], f["column"], f["unexpected_count"]) == ("feature_type", None, 2)
    assert f["examples"] == [{"column": "hue", "dtype": "object"}, {"column": "when", "dtype": "datetime64[us]"}]
    assert f["detail"] == ("2 feature columns of a type a model cannot take (numbers, text or booleans): "
                           "hue is object, when is datetime64[us]")
    assert f["message"] == "test: " + f["detail"]


def test_balance_failure_names_the_labels_out_of_range():
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_between",
            {"column": "fraction", "min_value": 0.07, "max_value": 0.13},
            {"unexpected_count": 2,
             "unexpected_index_list": [{"label": [3, 8], "fraction": [0.0, 0.1512345]}]},
        ),
        "train",
        "balance",
    )
    assert (f["check"], f["column"], f["expectation"]) == ("class_balance", "label", "expect_column_values_to_be_between")
    assert f["examples"] == [{"label": 3, "fraction": 0.0}, {"label": 8, "fraction": 0.1512}]
    assert f["detail"] == "2 classes with a share outside [0.07, 0.13]: 3 (0.000), 8 (0.151)"


def test_cross_failure_pairs_train_and_test_rows():
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_unique",
            {"column": "row_hash"},
            {"unexpected_count": 4,
             "unexpected_index_list": [{"row_hash": ["h1", "h2", "h1", "h2"],
                                        "split": ["train", "train", "test", "test"],
                                        "row": [100, 200, 5, 6]}]},
        ),
        "cross",
        "cross",
    )
    assert (f["split"], f["check"], f["column"], f["unexpected_count"]) == ("cross", "leak", None, 4)
    assert f["examples"] == [{"train_row": 100, "test_row": 5}, {"train_row": 200, "test_row": 6}]
    assert f["detail"] == "2 rows of test also in train: train[100] = test[5], train[200] = test[6]"


def test_an_expectation_gx_could_not_evaluate_is_a_failure_with_its_message():
    f = failure_from_result(
        evr(
            "expect_column_values_to_be_in_set",
            {"column": "label", "value_set": [0, 1]},
            {},
            exception={"MetricConfigurationID(...)": {
                "raised_exception": True,
                "exception_traceback": "Traceback ...",
                "exception_message": 'Error: The column "label" in BatchData does not exist.',
            }},
        ),
        "train",
    )
    assert f["unexpected_count"] is None and f["examples"] == []
    assert f["detail"] == 'could not be evaluated: Error: The column "label" in BatchData does not exist.'


def test_cells_failures_split_one_gx_result_into_exact_per_column_counts():
    result = evr(
        "expect_column_values_to_be_between",
        {"column": "value", "min_value": 0.0, "max_value": 16.0},
        {"unexpected_count": 3,
         "unexpected_index_list": [{"cell_column": ["pixel_2", "pixel_2", "pixel_40"],
                                    "cell_row": [7, 8, 0],
                                    "cell_value": [99.0, 17.0, -1.0]}]},
    )
    out = cells_failures(result, "test")
    assert [(f["column"], f["unexpected_count"], f["examples"], f["rows"]) for f in out] == [
        ("pixel_2", 2, [99, 17], [7, 8]),
        ("pixel_40", 1, [-1], [0]),
    ]
    assert all(f["expectation"] == "expect_column_values_to_be_between" and f["check"] == "range" for f in out)
    assert out[0]["detail"] == "2 values outside [0, 16]: 99 ×1, 17 ×1 (rows 7, 8)"

    nulls = cells_failures(
        evr("expect_column_values_to_not_be_null", {"column": "value"},
            {"unexpected_count": 1,
             "unexpected_index_list": [{"cell_column": ["pixel_5"], "cell_row": [3], "cell_value": [None]}]}),
        "train",
    )
    assert nulls == [dict(NULL_FAILURE, unexpected_count=1, examples=["row 3"], rows=[3], detail="1 null value (row 3)",
                          message="train.pixel_5: 1 null value (row 3)")]


def test_cells_range_failures_name_each_column_s_own_bound():
    def pair(column_a, column_b, cells):
        return evr(
            "expect_column_pair_values_a_to_be_greater_than_b",
            {"column_A": column_a, "column_B": column_b, "or_equal": True},
            {"unexpected_count": len(cells["cell_row"]), "unexpected_index_list": [cells]},
        )

    low = cells_failures(pair("value", "min", {
        "cell_column": ["alcohol", "proline"], "cell_row": [1, 2], "cell_value": [3.5, 100.0],
        "cell_min": [10.2, 278.0], "cell_max": [15.6, None]}), "train")
    assert [(f["check"], f["column"], f["examples"], f["detail"]) for f in low] == [
        ("range", "alcohol", [3.5], "1 value below min 10.2: 3.5 ×1 (row 1)"),
        ("range", "proline", [100], "1 value below min 278: 100 ×1 (row 2)"),
    ]
    high = cells_failures(pair("max", "value", {
        "cell_column": ["pixel_3", "pixel_3"], "cell_row": [0, 9], "cell_value": [17, 20],
        "cell_min": [0.0, 0.0], "cell_max": [16.0, 16.0]}), "test")
    assert [(f["column"], f["unexpected_count"], f["detail"]) for f in high] == [
        ("pixel_3", 2, "2 values above max 16: 17 ×1, 20 ×1 (rows 0, 9)"),
    ]


def test_failures_from_results_skips_successes_and_flattens_cells():
    ok = evr("expect_column_values_to_not_be_null", {"column": "label"}, {"unexpected_count": 0}, success=True)
    bad_cells = evr(
        "expect_column_values_to_not_be_null", {"column": "value"},
        {"unexpected_count": 2,
         "unexpected_index_list": [{"cell_column": ["pixel_1", "pixel_9"], "cell_row": [0, 0], "cell_value": [None, None]}]},
    )
    out = failures_from_results([("train", "split", ok), ("train", "cells", bad_cells)])
    assert [f["column"] for f in out] == ["pixel_1", "pixel_9"]


def test_sort_failures_orders_split_then_table_then_columns_then_balance_and_leak():
    def f(split, check, column=None):
        return {"split": split, "check": check, "column": column}

    shuffled = [
        f("cross", "leak"),
        f("train", "class_balance", "label"),
        f("test", "nulls", "pixel_1"),
        f("train", "label_set", "label"),
        f("train", "range", "pixel_10"),
        f("train", "nulls", "pixel_10"),
        f("train", "range", "pixel_2"),
        f("train", "dtype", "pixel_3"),
        f("train", "columns"),
        f("train", "feature_type", "pixel_4"),
        f("train", "value_set", "pixel_2"),
        f("train", "label_column", "label"),
    ]
    columns = [f"pixel_{i}" for i in range(64)] + ["label"]
    got = [(x["split"], x["check"], x["column"]) for x in sort_failures(shuffled, columns)]
    assert got == [
        ("train", "columns", None),
        ("train", "label_column", "label"),
        ("train", "dtype", "pixel_3"),
        ("train", "feature_type", "pixel_4"),
        ("train", "range", "pixel_2"),
        ("train", "value_set", "pixel_2"),
        ("train", "nulls", "pixel_10"),
        ("train", "range", "pixel_10"),
        ("train", "label_set", "label"),
        ("train", "class_balance", "label"),
        ("test", "nulls", "pixel_1"),
        ("cross", "leak", None),
    ]


def test_index_records_accepts_every_shape_gx_returns():
    assert index_records({"partial_unexpected_index_list": [3, 4]}) == [3, 4]
    assert index_records({"unexpected_index_list": [{"a": 1}]}) == [{"a": 1}]
    assert index_records({"unexpected_index_list": [{"a": [1, 2], "b": ["x", "y"]}]}) == [
        {"a": 1, "b": "x"},
        {"a": 2, "b": "y"},
    ]
    assert index_records({}) == []


def test_jsonable_gives_strict_json():
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    value = {"a": np.int64(3), "b": np.float64("nan"), "c": [pd.NA, math.inf, np.bool_(True)], 4: (1.5,)}
    out = jsonable(value)
    assert out == {"a": 3, "b": None, "c": [None, None, True], "4": [1.5]}
    json.dumps(out, allow_nan=False)


# ----------------------------------------------------------------------------- the suite's hashes


def _digits_like(**overrides) -> TableExpectations:
    cols = [ColumnExpectation(name=f"pixel_{i}", type="integer", min=0, max=16) for i in range(3)]
    cols.append(ColumnExpectation(name="label", type="integer", values=[0, 1]))
    return TableExpectations(label="label", columns=cols, rows={"train": (10, 20)}, class_share=(0.4, 0.6)).model_copy(
        update=overrides)


def table_suite_hash(exp: TableExpectations, features: list[str], label: str, class_label: bool) -> str:
    """The table suite's key (``gx_run.suite_key``) for a plan of two split files."""
    from types import SimpleNamespace

    from tasks.base import ValidationPlan

    params = {"dataset": SimpleNamespace(file=None), "expectations": exp, "features": features, "label": label,
              "class_label": class_label}
    return suite_key(ValidationPlan("validation.suite", [], params))


def test_suite_hash_changes_with_any_bound_column_or_role():
    exp = _digits_like()
    features = ["pixel_0", "pixel_1", "pixel_2"]
    base = table_suite_hash(exp, features, "label", True)
    assert base == table_suite_hash(_digits_like(), list(features), "label", True)
    bumped = [c.model_copy(update={"max": 15.0}) if c.name == "pixel_1" else c for c in exp.columns]
    others = {
        table_suite_hash(exp.model_copy(update={"columns": bumped}), features, "label", True),
        table_suite_hash(exp.model_copy(update={"rows": {"train": (10, 21)}}), features, "label", True),
        table_suite_hash(exp.model_copy(update={"class_share": (0.3, 0.6)}), features, "label", True),
        table_suite_hash(exp, features[:2], "label", True),
        table_suite_hash(exp, features, "label", False),
    }
    assert base not in others and len(others) == 5


def test_data_hash_follows_the_bytes_and_names_a_missing_file(tmp_path):
    a, b = tmp_path / "train.csv", tmp_path / "test.csv"
    a.write_text("x,label\n1,0\n")
    b.write_text("x,label\n2,1\n")
    first = table_data_hash([a, b])
    assert first == table_data_hash([a, b]) and len(first) == 64
    b.write_text("x,label\n3,1\n")
    assert table_data_hash([a, b]) != first
    with pytest.raises(DataUnavailableError) as err:
        table_data_hash([a, tmp_path / "gone.csv"])
    assert str(tmp_path / "gone.csv") in str(err.value) and "dvc pull" in str(err.value)


@pytest.mark.parametrize("info, detail", [
    ({"raised_exception": True, "exception_message": None}, "could not be evaluated: unknown error"),
    ({"m": {"raised_exception": True, "exception_message": "Traceback ...\nKeyError: 'path'"}},
     "could not be evaluated: KeyError: 'path'"),
])
def test_a_derived_suite_result_gx_could_not_evaluate_says_so_as_a_table_s_does(info, detail):
    from validation import text_suite
    from validation.gx_run import Item, _derived_failure

    result = {"success": False, "exception_info": info, "result": {},
              "expectation_config": {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "path"}}}
    f = _derived_failure(text_suite, Item("train", "train", "text", None, [], {}), result)
    assert f["detail"] == detail and f["unexpected_count"] is None
    assert f["message"].endswith(detail)
