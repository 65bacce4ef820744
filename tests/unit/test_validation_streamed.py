"""The parts of bounded-memory validation that need no GX run: merging per-batch results, the
cells that can fail a stacked check, row hashes, the leak frame, and when a split streams."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from core.config import DatasetConfig
from core.expectations import ColumnExpectation
from validation.gx_run import _join_complete, _join_counts, _restate
from validation.suite import _cell_suspects, _cross_from_hashes, _row_hash_array, streamed


def _evr(n, missing, unexpected, mostly=None, **extra):
    kwargs = {"column": "value", **({"mostly": mostly} if mostly is not None else {})}
    result = {"element_count": n, "missing_count": missing, "unexpected_count": unexpected,
              "missing_percent": None, "unexpected_percent": None, "unexpected_percent_total": None, **extra}
    return NS(result=result, success=None, exception_info=None, expectation_config=NS(kwargs=kwargs))


def test_restate_recomputes_percents_success_and_statistics_from_summed_counts():
    merged = NS(results=[_evr(200, 50, 0), _evr(200, 0, 3), _evr(100, 0, 4, mostly=0.95)], success=None,
                statistics={})
    _restate(merged)
    ok, bad, mostly = (r.result for r in merged.results)
    assert ok["missing_percent"] == 25.0 and ok["unexpected_percent"] == 0.0
    assert bad["unexpected_percent"] == 1.5 and bad["unexpected_percent_total"] == 1.5
    assert [r.success for r in merged.results] == [True, False, True]  # 96 % >= mostly 0.95
    assert merged.success is False
    assert merged.statistics == {"evaluated_expectations": 3, "successful_expectations": 2,
                                 "unsuccessful_expectations": 1, "success_percent": pytest.approx(200 / 3)}


def test_complete_index_lists_join_as_one_dict_of_lists_and_are_cut():
    a = [{"cell_column": ["x", "x"], "cell_row": [1, 2]}]
    b = [{"cell_column": ["y"], "cell_row": [70]}]
    assert _join_complete(a, b, keep=10) == [{"cell_column": ["x", "x", "y"], "cell_row": [1, 2, 70]}]
    assert _join_complete(a, b, keep=2) == [{"cell_column": ["x", "x"], "cell_row": [1, 2]}]
    assert _join_complete([], b, keep=10) == b
    assert _join_complete([3, 5], [90], keep=2) == [3, 5]  # row positions (SUMMARY)
    counts = _join_counts([{"value": 7, "count": 1}, {"value": 8, "count": 1}], [{"value": 8, "count": 2}], 5)
    assert counts == [{"value": 8, "count": 3}, {"value": 7, "count": 1}]


def test_cell_suspects_are_exactly_the_failing_cells_with_the_whole_batchs_counts():
    cols = [ColumnExpectation(name="a", type="float", min=0, max=1),
            ColumnExpectation(name="b", type="float", min=0, nulls=True),
            ColumnExpectation(name="label", type="integer", nulls=False)]
    batch = pa.record_batch({"a": [0.5, -1.0, None, 2.0], "b": [None, -3.0, 5.0, 0.0], "label": [1, None, 2, 3]})
    exps = [NS(expectation_type="expect_column_values_to_not_be_null"),
            NS(expectation_type="expect_column_pair_values_a_to_be_greater_than_b", column_A="value"),
            NS(expectation_type="expect_column_pair_values_a_to_be_greater_than_b", column_A="max")]
    frame, counts = _cell_suspects(batch, cols, 100, exps)
    # a: -1 (below), null, 2 (above); b: -3 (below; its null is allowed); the label may not be null
    # (its expectations say so: a label may be null only where they allow unlabeled rows).
    assert list(zip(frame["column"], frame["row"])) == [("a", 101), ("a", 102), ("a", 103), ("b", 101),
                                                        ("label", 101)]
    kept = 12 - 1  # b's allowed null is left out, as the in-memory cells frame leaves it out
    assert counts == {0: {"element_count": kept},
                      1: {"element_count": kept, "missing_count": 1 + 4},  # a's null; the label has no min
                      2: {"element_count": kept, "missing_count": 1 + 3 + 4}}  # a's null; b, label: no max


def test_row_hashes_equal_for_equal_values_whatever_the_number_type():
    ints = pa.record_batch({"x": pa.array([3, 4], type=pa.int64()), "s": ["a", None]})
    floats = pa.record_batch({"x": [3.0, 4.5], "s": ["a", None]})
    h1, h2 = _row_hash_array(ints, ["x", "s"]), _row_hash_array(floats, ["x", "s"])
    assert h1[0] == h2[0] and h1[1] != h2[1]


def test_leak_frame_keeps_first_rows_of_hashes_in_both_splits_and_counts_all_rows():
    hashes = {"train": [np.array([5, 6, 7], dtype="uint64"), np.array([5, 9], dtype="uint64")],
              "test": [np.array([9, 1, 9, 6], dtype="uint64")]}
    frame, total = _cross_from_hashes(hashes)
    assert total == 4 + 3  # de-duplicated rows: train 5, 6, 7, 9; test 9, 1, 6
    assert frame[["split", "row"]].values.tolist() == [["train", 1], ["train", 4], ["test", 0], ["test", 3]]
    assert frame["row_hash"].tolist() == [f"{6:016x}", f"{9:016x}", f"{9:016x}", f"{6:016x}"]


def test_a_split_streams_when_it_is_a_folder_or_its_files_are_large(tmp_path):
    (tmp_path / "d").mkdir()
    pd.DataFrame({"a": [1.0]}).to_csv(tmp_path / "d" / "train.csv", index=False)
    pd.DataFrame({"a": [1.0]}).to_csv(tmp_path / "d" / "test.csv", index=False)
    params = {"dataset": DatasetConfig(path="d"), "root": tmp_path}
    assert not streamed(params)
    assert streamed({**params, "stream_above_bytes": 5})
    (tmp_path / "d" / "shards").mkdir()
    assert streamed({**params, "dataset": DatasetConfig(path="d", train_file="shards")})


def test_the_default_threshold_streams_a_1m_row_table_and_keeps_small_data_in_memory(tmp_path):
    # Read whole, a table costs ~20x its Parquet size (4.1 GB for a 200 MB file of 1 M rows x 33
    # columns): above 32 MB together the splits stream. Sparse files: only the size is read.
    (tmp_path / "d").mkdir()
    params = {"dataset": DatasetConfig(path="d", train_file="train.parquet", test_file="test.parquet"),
              "root": tmp_path}
    for name, size in (("train.parquet", 30 << 20), ("test.parquet", 1 << 20)):
        with open(tmp_path / "d" / name, "wb") as f:
            f.truncate(size)
    assert not streamed(params)  # 31 MB
    with open(tmp_path / "d" / "train.parquet", "wb") as f:
        f.truncate(32 << 20)
    assert streamed(params)  # 33 MB
    # The shipped data (digits: two CSVs; wine: one file split by seed) is validated in memory.
    repo = Path(__file__).resolve().parents[2]
    assert not streamed({"dataset": DatasetConfig(path="data/digits"), "root": repo})
    assert not streamed({"dataset": DatasetConfig(path="data/wine", file="wine.csv"), "root": repo})


def test_grouped_index_lists_keep_a_few_cells_per_column_and_the_report_counts_them_exactly():
    from validation.gx_run import BY_GROUP, _count_groups
    from validation.report import cells_failures

    result = {"unexpected_count": 6, "unexpected_index_list": [{
        "cell_column": ["a", "a", "a", "a", "b", "a"], "cell_row": [1, 2, 3, 4, 9, 5],
        "cell_value": [-1, -2, -3, -4, -9, -5], "cell_min": [0] * 6, "cell_max": [None] * 6}]}
    _count_groups(result, "cell_column", keep=2)
    assert result[BY_GROUP] == {"a": 5, "b": 1}
    assert result["unexpected_index_list"][0]["cell_row"] == [1, 2, 9]  # two of a, b's one
    evr = {"success": False, "result": result, "expectation_config": {
        "type": "expect_column_pair_values_a_to_be_greater_than_b",
        "kwargs": {"column_A": "value", "column_B": "min"}}}
    a, b = cells_failures(evr, "train")
    assert (a["column"], a["unexpected_count"], a["rows"]) == ("a", 5, [1, 2])
    assert a["detail"] == "5 values below min 0, e.g. -1, -2 (rows 1, 2 ...)"
    assert (b["column"], b["unexpected_count"]) == ("b", 1)
