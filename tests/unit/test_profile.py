"""profile_table: the data a user brings -> the content of its expectations file."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from core.expectations import TableExpectations
from validation.profile import column_type, profile_table


def frames() -> dict[str, pd.DataFrame]:
    train = pd.DataFrame({
        "age": [20, 30, 40, 60],                      # integer, non-negative
        "temp": [-1.5, 0.25, 2.0, 8.5],               # float, range 10
        "ratio": [0.1, 0.2, 0.3, 0.5],                # float, non-negative, near 0
        "city": ["paris", "rome", None, "oslo"],      # string, few values, one null
        "member": [True, False, True, True],          # boolean
        "target": ["b", "a", "a", "a"],
    })
    test = pd.DataFrame({
        "age": [25, 35], "temp": [1.0, 3.0], "ratio": [0.2, 0.4], "city": ["rome", "paris"],
        "member": [False, True], "target": ["a", "b"],
    })
    return {"train": train, "test": test}


def test_columns_in_file_order_with_types():
    exp = profile_table(frames(), "target", classification=True)
    assert isinstance(exp, TableExpectations)
    assert exp.names == ["age", "temp", "ratio", "city", "member", "target"]
    assert [c.type for c in exp.columns] == ["integer", "float", "float", "string", "boolean", "string"]
    assert exp.label == "target"


def test_integer_bounds_widen_by_margin_of_range_and_stay_whole():
    age = profile_table(frames(), "target", classification=True, margin=0.1).column("age")
    # range 20..60 = 40, widened by 4 each side
    assert (age.min, age.max) == (16, 64)
    assert float(age.min).is_integer() and float(age.max).is_integer()


def test_float_bounds_widen_and_round_outward():
    temp = profile_table(frames(), "target", classification=True, margin=0.1).column("temp")
    # range -1.5..8.5 = 10, widened by 1: [-2.5, 9.5], exact at two significant digits of the pad
    assert (temp.min, temp.max) == (-2.5, 9.5)
    odd = profile_table({"train": pd.DataFrame({"x": [0.123, 0.987], "y": [1, 2]})}, "y", False).column("x")
    assert odd.min <= 0.123 - 0.0864 and odd.max >= 0.987 + 0.0864   # never narrower than the margin
    assert odd.min == pytest.approx(0.036) and odd.max == pytest.approx(1.074)  # 2 significant digits of 0.0864


def test_non_negative_column_keeps_zero_as_lower_bound():
    ratio = profile_table(frames(), "target", classification=True, margin=0.5).column("ratio")
    # 0.1 - 0.5 * 0.4 would be negative: a column never below zero stays >= 0
    assert ratio.min == 0 and ratio.max >= 0.7
    temp = profile_table(frames(), "target", classification=True, margin=0.5).column("temp")
    assert temp.min < -1.5  # a column that went negative widens below zero as usual


def test_constant_column_still_gets_room():
    col = profile_table({"train": pd.DataFrame({"c": [5, 5, 5], "y": [0, 1, 0]})}, "y", True).column("c")
    assert col.min < 5 < col.max
    zero = profile_table({"train": pd.DataFrame({"c": [0, 0], "y": [0, 1]})}, "y", True).column("c")
    assert (zero.min, zero.max) == (0, 1)


def test_nulls_true_only_where_seen():
    exp = profile_table(frames(), "target", classification=True)
    assert exp.column("city").nulls is True
    assert not any(c.nulls for c in exp.columns if c.name != "city")


def test_string_values_listed_sorted_when_few_and_left_open_when_many():
    exp = profile_table(frames(), "target", classification=True)
    assert exp.column("city").values == ["oslo", "paris", "rome"]
    many = pd.DataFrame({"id": [f"row{i}" for i in range(50)], "y": [i % 2 for i in range(50)]})
    assert profile_table({"train": many}, "y", True).column("id").values is None


def test_classification_label_values_sorted_ints_or_strings():
    assert profile_table(frames(), "target", True).classes == ["a", "b"]
    ints = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "y": [10, 2, 2, 10]})
    exp = profile_table({"train": ints}, "y", True)
    assert exp.classes == [2, 10] and all(type(v) is int for v in exp.classes)
    assert exp.column("y").min is None and exp.column("y").type == "integer"


def test_integer_label_read_as_float_because_of_a_null_is_still_integer():
    df = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, None]})
    assert df["y"].dtype == float
    col = profile_table({"train": df}, "y", True).column("y")
    assert col.type == "integer" and col.values == [0, 1] and col.nulls is True


def test_regression_label_is_a_bounded_number_without_values_or_class_share():
    df = pd.DataFrame({"x": [1, 2, 3], "price": [10.0, 20.5, 30.0]})
    exp = profile_table({"train": df, "test": df}, "price", classification=False)
    price = exp.column("price")
    assert price.values is None and price.min < 10 and price.max > 30
    assert exp.class_share is None


def test_row_ranges_per_split_are_half_to_double():
    exp = profile_table({"train": pd.DataFrame({"x": range(101), "y": [0, 1] * 50 + [0]}),
                         "test": pd.DataFrame({"x": range(20), "y": [0, 1] * 10})}, "y", True)
    assert exp.rows == {"train": (50, 202), "test": (10, 40)}


def test_class_share_is_smallest_and_largest_widened_by_margin_and_clamped():
    exp = profile_table(frames(), "target", classification=True, margin=0.1)
    # train: a 3/4, b 1/4; test: a 1/2, b 1/2 -> [0.25, 0.75] widened by 10 % of the share
    assert exp.class_share == (pytest.approx(0.225), pytest.approx(0.825))
    lopsided = pd.DataFrame({"x": [1, 2, 3], "y": ["a", "a", "a"]})
    assert profile_table({"train": lopsided}, "y", True, margin=0.5).class_share == (0.5, 1.0)


def test_class_missing_from_a_split_counts_as_share_zero():
    train = pd.DataFrame({"x": [1, 2, 3, 4], "y": ["a", "b", "c", "c"]})
    test = pd.DataFrame({"x": [1, 2], "y": ["a", "b"]})
    assert profile_table({"train": train, "test": test}, "y", True).class_share[0] == 0


def test_the_profile_round_trips_through_the_expectations_file(tmp_path):
    from core.expectations import load_expectations

    exp = profile_table(frames(), "target", classification=True)
    path = tmp_path / "x.expectations.yaml"
    path.write_text(exp.to_yaml("# header\n"))
    assert load_expectations(path) == exp


def test_the_profiled_data_lies_within_its_own_bounds():
    fr = frames()
    exp = profile_table(fr, "target", classification=True, margin=0.0)
    both = pd.concat(fr.values())
    for col in exp.columns:
        if col.min is not None:
            assert col.min <= both[col.name].min() and both[col.name].max() <= col.max, col.name


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="label: 'nope' is not a column"):
        profile_table(frames(), "nope", True)
    with pytest.raises(ValueError, match="frames: expected the splits"):
        profile_table({"all": frames()["train"]}, "target", True)


@pytest.mark.parametrize(("values", "kind"), [
    ([1, 2, None], "integer"), ([1.5, None], "float"), (["a", 1], "string"), ([True, None], "boolean"),
    ([math.inf, 1.0], "float"), ([None, None], "float"),
])
def test_column_type(values, kind):
    assert column_type(pd.Series(values, dtype=float if kind == "float" and None in values else None)) == kind
