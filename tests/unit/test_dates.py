"""Date and timestamp columns: the format init finds, the parts a date becomes, the same parts in
the registered pyfunc from the raw text, and validation naming values that are not dates."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from core.config import load_config
from core.errors import ConfigError
from tasks.encoding import DATE_PARTS, date_parts, detect_date_format, encode, fit_columns
from tests.pyfuncs import pyfunc_module


@pytest.mark.parametrize("values, fmt", [
    (["2016-07-01", "2016-12-31", None], "%Y-%m-%d"),
    (["2016-07-01 13:45", "2016-07-02 00:05"], "%Y-%m-%d %H:%M"),
    (["2016-07-01 13:45:10", "2016-07-02 00:05:00"], "%Y-%m-%d %H:%M:%S"),
    (["2016-07-01T13:45:00", "2016-07-02T00:05:00"], "%Y-%m-%dT%H:%M:%S"),
    (["07/01/2016", "07/31/2016"], "%m/%d/%Y"),  # 31 cannot be a month: month first
    (["01.07.2016", "31.12.2016"], "%d.%m.%Y"),
])
def test_init_finds_the_format_of_a_date_column(values, fmt):
    found, why = detect_date_format(pd.Series(values, dtype=object))
    assert found == fmt and fmt in why


@pytest.mark.parametrize("values, why", [
    (["07/01/2016", "08/02/2016"], "ambiguous"),  # day first and month first both read every value
    (["oslo", "rome"], "not dates"),
    ([3, 4], "not text"),
])
def test_text_that_is_not_one_date_format_stays_text(values, why):
    found, said = detect_date_format(pd.Series(values))
    assert found is None and why in said


def test_a_date_becomes_its_parts_and_a_bad_or_missing_one_is_missing():
    parts = date_parts(pd.Series(["2016-07-01 13:45", None, "2016-13-01 00:00"]), "%Y-%m-%d %H:%M")
    assert set(parts) == set(DATE_PARTS)
    first = {k: v[0] for k, v in parts.items()}
    assert first == {"year": 2016, "month": 7, "day": 1, "weekday": 4, "dayofyear": 183, "hour": 13,
                     "days": pytest.approx(16983 + (13 * 60 + 45) / 1440), "missing": 0.0}
    assert all(np.isnan(v[1:]).all() for k, v in parts.items() if k != "missing")
    assert parts["missing"][1:].tolist() == [1.0, 1.0]


def test_the_fit_has_one_numeric_column_per_part_and_no_hour_without_one():
    df = pd.DataFrame({"day": ["2016-07-01", "2016-07-09", None], "x": [1.0, 2.0, 3.0]})
    cols = fit_columns([df], {"day": "date", "x": "numeric"}, 10, 0, {"day": "%Y-%m-%d"},
                       ["year", "weekday", "hour", "missing"])
    assert [c["name"] for c in cols] == ["day.year", "day.weekday", "day.missing", "x"]
    assert all(c["kind"] == "numeric" for c in cols) and cols[2]["mean"] == pytest.approx(1 / 3)
    assert encode(df, cols)[:, :3].tolist()[0] == [2016.0, 4.0, 0.0]


def test_the_pyfunc_takes_raw_date_strings_and_encodes_them_as_training_did(tmp_path):
    rng = np.random.default_rng(0)
    stamps = pd.Timestamp("2015-01-01") + pd.to_timedelta(rng.integers(0, 10**6, 200), unit="min")
    df = pd.DataFrame({"at": stamps.strftime("%Y-%m-%d %H:%M").astype(object), "x": rng.normal(size=200)})
    df.loc[[3, 8], "at"] = None
    cols = fit_columns([df], {"at": "date", "x": "numeric"}, 10, 0, {"at": "%Y-%m-%d %H:%M"}, DATE_PARTS)
    seen = []

    def program(x):
        seen.append(x.numpy().copy())
        return torch.zeros(len(x), 1)

    module = pyfunc_module("pyfunc_table.py")
    meta = {"feature_columns": ["at", "x"],
            "columns": [{"name": c["name"], "kind": c["kind"], **{k: c[k] for k in ("source", "part", "format")
                                                                  if k in c}} for c in cols]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    model = module.ExportedTable()
    original = torch.export.load
    torch.export.load = lambda path: SimpleNamespace(module=lambda: program)
    try:
        model.load_context(SimpleNamespace(artifacts={"meta": str(tmp_path / "meta.json"), "model": "unused"}))
    finally:
        torch.export.load = original
    raw = df.copy()
    raw.loc[5, "at"] = "not a date"  # a serving client's bad value: missing, as in training
    model.predict(None, raw)
    np.testing.assert_array_equal(seen[0], encode(raw, cols))
    assert seen[0].shape == (200, 9) and seen[0][5, 7] == 1.0  # its missing flag


def test_dates_config_is_checked_and_keeps_old_config_ids(repo_root):
    plain = load_config(repo_root / "configs" / "wine.yaml")
    assert load_config(repo_root / "configs" / "wine.yaml", ["dataset.date_parts=[year, month, day, weekday, "
                                                              "dayofyear, hour, days, missing]"]).config_id() \
        == plain.config_id()
    with pytest.raises(ConfigError, match=r"dataset.*dates\.x: 'x' is not a strftime format"):
        load_config(repo_root / "configs" / "wine.yaml", ["dataset.dates={x: x}"])


def test_init_takes_a_timestamp_unique_in_every_row_as_a_date_not_an_id():
    from flows.init import choice_lines
    from tasks import get_task
    from tests.tables import hotels

    df = hotels(400)
    df["booked_at"] = (pd.Timestamp("2015-01-01") + pd.to_timedelta(np.arange(400), unit="h")).strftime(
        "%Y-%m-%dT%H:%M:%S")  # complete and unique: an id by the identifier rule alone
    choices = get_task("regression").init_choices({"train": df[:320], "test": df[320:]}, "price", False)
    assert choices["dates"]["booked_at"]["format"] == "%Y-%m-%dT%H:%M:%S"
    assert list(choices["exclude"]) == ["booking_id"]
    assert choices["training"]["early_stopping"] == {"patience": 10}  # ~32 validation rows: noisy
    lines = choice_lines(choices)
    assert any(line.startswith("dates:        booked_at: 400 distinct values in format %Y-%m-%dT%H:%M:%S: "
                               "becomes year, month, day of month, day of week, day of year, hour,") for line in lines)
