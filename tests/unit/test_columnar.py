"""Bounded-memory table reading and streamed column statistics (tasks.columnar) against pandas on
the whole table: Parquet files, a folder of them, CSV; batches never larger than asked."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.errors import DataUnavailableError
from tasks.columnar import ColumnStats, iter_batches, parquet_files, source_rows
from tasks.table import read_table


def column_stats(batches, columns: list[str], categories=()) -> dict[str, ColumnStats]:
    """``{column: ColumnStats}`` over every batch, counting each value of the ``categories`` columns."""
    stats = {c: ColumnStats(c, values={} if c in categories else None) for c in columns}
    for batch in batches:
        for c in columns:
            stats[c].update(batch.column(batch.schema.names.index(c)))
    return stats


def _table(n: int = 1000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "x": rng.normal(1e6, 3.0, n),              # a large mean: the naive sum-of-squares loses digits
        "k": rng.integers(-50, 50, n),
        "f": rng.uniform(0, 1, n),
        "label": rng.choice(["a", "b", "c"], n),
    })
    df.loc[df.index % 17 == 3, "f"] = np.nan
    return df


def _pandas_stats(df: pd.DataFrame, col: str) -> dict:
    s = df[col]
    return {"count": int(s.notna().sum()), "nulls": int(s.isna().sum()), "min": s.min(), "max": s.max(),
            "mean": s.mean(), "std": s.std(ddof=0)}


def _check(stats, df, cols):
    for c in cols:
        want, got = _pandas_stats(df, c), stats[c]
        assert (got.count, got.nulls) == (want["count"], want["nulls"]), c
        assert got.min == want["min"] and got.max == want["max"], c
        assert got.mean == pytest.approx(want["mean"], rel=1e-12), c
        assert got.std == pytest.approx(want["std"], rel=1e-9), c


def test_parquet_row_groups_stream_in_bounded_batches_and_stats_equal_pandas(tmp_path):
    df = _table()
    path = tmp_path / "t.parquet"
    df.to_parquet(path, row_group_size=300)
    batches = list(iter_batches(path, columns=["x", "k", "f", "label"], batch_rows=128))
    assert max(b.num_rows for b in batches) <= 128 and sum(b.num_rows for b in batches) == len(df)
    assert len(batches) > 4
    assert source_rows(path) == len(df)
    stats = column_stats(iter(batches), ["x", "k", "f", "label"], categories=["label"])
    _check(stats, df, ["x", "k", "f"])
    assert stats["label"].values == df["label"].value_counts().to_dict()
    assert stats["label"].min is None and stats["label"].count == len(df)
    assert isinstance(stats["k"].min, int)  # exact integers, not float64


def test_folder_of_parquet_files_reads_in_name_order(tmp_path):
    df = _table(900)
    folder = tmp_path / "shards"
    folder.mkdir()
    for i, start in enumerate(range(0, 900, 250)):
        df.iloc[start:start + 250].to_parquet(folder / f"part-{i:03d}.parquet", row_group_size=100)
    (folder / "README.txt").write_text("not a table")
    assert [p.name for p in parquet_files(folder)] == [f"part-{i:03d}.parquet" for i in range(4)]
    got = pa.Table.from_batches(list(iter_batches(folder, columns=["k", "x"], batch_rows=64))).to_pandas()
    assert got["k"].tolist() == df["k"].tolist() and list(got.columns) == ["k", "x"]
    _check(column_stats(iter_batches(folder, batch_rows=64), ["x", "k", "f"]), df, ["x", "k", "f"])


def test_csv_streams_in_blocks_and_widens_integers_a_later_block_breaks(tmp_path, monkeypatch):
    import tasks.columnar as columnar

    monkeypatch.setattr(columnar, "CSV_BLOCK_BYTES", 4096)  # many blocks from a small file
    df = _table(2000)
    df["k"] = df["k"].astype("float64")
    df.loc[1500, "k"] = 0.5  # the first block saw only whole numbers
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    batches = list(iter_batches(path, batch_rows=100))
    assert len(batches) > 20 and max(b.num_rows for b in batches) <= 100
    stats = column_stats(batches, ["x", "k", "f", "label"], categories=["label"])
    whole = pd.read_csv(path)
    _check(stats, whole, ["k", "f"])
    assert stats["x"].mean == pytest.approx(whole["x"].mean(), rel=1e-12)  # CSV text round-trips x
    assert stats["label"].values == whole["label"].value_counts().to_dict()
    assert not stats["k"].integral


def test_csv_text_in_a_numeric_column_names_the_column(tmp_path, monkeypatch):
    import tasks.columnar as columnar

    monkeypatch.setattr(columnar, "CSV_BLOCK_BYTES", 1024)
    lines = ["a,b"] + [f"{i},{i * 2}" for i in range(500)] + ["7,oops"]
    path = tmp_path / "t.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataUnavailableError, match=r"column 'b'.*types="):
        list(iter_batches(path))


def test_missing_source_column_and_bad_format_name_the_path(tmp_path):
    with pytest.raises(DataUnavailableError, match=r"nope.parquet does not exist.*run `dvc pull`"):
        list(iter_batches(tmp_path / "nope.parquet"))
    with pytest.raises(DataUnavailableError, match=r"nope.csv does not exist.*run `dvc pull`"):
        read_table(tmp_path / "nope.csv")
    pd.DataFrame({"a": [1.0]}).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(DataUnavailableError, match=r"lacks column\(s\) \['b'\]"):
        list(iter_batches(tmp_path / "t.parquet", columns=["a", "b"]))
    with pytest.raises(DataUnavailableError, match="unknown table format"):
        list(iter_batches(tmp_path / "t.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataUnavailableError, match="no .parquet files"):
        list(iter_batches(tmp_path / "empty"))


def test_merge_of_parts_equals_one_pass_and_handles_empty_and_all_null_parts():
    rng = np.random.default_rng(1)
    x = rng.normal(5, 2, 1000)
    x[::7] = np.nan
    parts = [pa.record_batch({"x": pa.array(x[a:b], from_pandas=True)})
             for a, b in [(0, 0), (0, 3), (3, 500), (500, 1000)]]
    parts.insert(2, pa.record_batch({"x": pa.nulls(5)}))
    stats = column_stats(parts, ["x"])["x"]
    v = x[~np.isnan(x)]
    assert (stats.count, stats.nulls) == (len(v), int(np.isnan(x).sum()) + 5)
    assert stats.mean == pytest.approx(v.mean(), rel=1e-13)
    assert stats.std == pytest.approx(v.std(), rel=1e-12)
    assert stats.var(1) == pytest.approx(v.var(ddof=1), rel=1e-12)
    empty = column_stats([pa.record_batch({"x": pa.nulls(3)})], ["x"])["x"]
    assert empty.count == 0 and empty.nulls == 3 and math.isnan(empty.std) and empty.min is None




def test_streamed_standardisation_equals_the_tasks_info_within_float_tolerance(tmp_path):
    """The tabular task's scaling (mean, std; a constant column's std 1) fitted in one streamed
    pass over the train file equals what ``info`` fits on the loaded split."""
    from core.config import PipelineConfig
    from tasks import get_task

    df = _table(3000)
    df["const"] = 4.0
    (tmp_path / "d").mkdir()
    df.iloc[:2500].to_parquet(tmp_path / "d" / "train.parquet", row_group_size=700)
    df.iloc[2500:].to_parquet(tmp_path / "d" / "test.parquet")
    (tmp_path / "exp.yaml").write_text("label: label\ncolumns:\n" + "".join(
        f"  - {{name: {c}, type: float}}\n" for c in ("x", "k", "f", "const"))
        + "  - {name: label, type: string, values: [a, b, c]}\n")
    features = ["x", "k", "f", "const"]
    cfg = PipelineConfig(name="t", dataset={"path": "d", "train_file": "train.parquet", "test_file": "test.parquet",
                                            "features": features, "expectations_file": "exp.yaml"})
    task = get_task("classification")
    info = task.info(cfg, tmp_path, task.frames(cfg, tmp_path))
    stats = column_stats(iter_batches(tmp_path / "d" / "train.parquet", columns=features, batch_rows=512), features)
    mean = [stats[c].mean for c in features]
    std = [stats[c].std if stats[c].std > 0 else 1.0 for c in features]
    assert info.features == features and info.std[3] == 1.0
    assert np.allclose(mean, info.mean, rtol=1e-12) and np.allclose(std, info.std, rtol=1e-9)


def test_column_stats_take_64_bit_integers_beyond_float64s_exact_range():
    import pyarrow as pa

    from tasks.columnar import ColumnStats

    stats = ColumnStats("id")
    stats.update(pa.array([2**62 + 1, 5, None]))
    assert (stats.count, stats.nulls, stats.min, stats.max) == (2, 1, 5, 2**62 + 1)  # exact, not rounded
