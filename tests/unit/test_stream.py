"""The streamed Parquet source: one global order whatever the world size, bounded shuffle, resize."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from core.config import config_from_dict
from core.errors import ConfigError, DataUnavailableError
from tasks.table_stream import choose_loader, csv_to_parquet, table_reader
from training.batches import BatchPlan
from training.stream import Holdout, StreamSource, scan_row_groups

ROWS, GROUP, FEATURES = 1000, 64, 3  # 16 row groups, the last one short


def write_table(path: Path, rows: int = ROWS, group: int = GROUP, files: int = 1) -> Path:
    """Parquet with ``group`` rows per row group; feature f0 holds the row's global id (to check reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir(parents=True, exist_ok=True)
    per = -(-rows // files)
    for i in range(files):
        ids = np.arange(i * per, min(rows, (i + 1) * per))
        table = pa.table({"f0": ids.astype(np.float64), "f1": np.sin(ids), "f2": np.cos(ids),
                          "label": (ids % 3).astype(np.int64)})
        pq.write_table(table, path / f"part-{i:02d}.parquet", row_group_size=group)
    return path


def source(folder: Path, seed: int = 0, window: int = 4, val_fraction: float = 0.1, val_rows: int = 10_000,
           prefetch: bool = True, reads: Counter | None = None) -> StreamSource:
    groups = scan_row_groups(folder)
    read = table_reader(groups, ["f0", "f1", "f2"], "label", lambda col: col.to_numpy().astype(np.int64))
    if reads is not None:
        inner = read

        def read(u):
            reads[u] += 1
            return inner(u)

    return StreamSource(groups, read, seed=seed, window=window, holdout=Holdout(groups, seed, val_fraction, val_rows),
                        n_features=FEATURES, y_dtype=np.int64, prefetch=prefetch)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_table(tmp_path_factory.mktemp("stream") / "train", files=2)


def run_steps(src: StreamSource, epoch: int, cursor: int, micro: int, accum: int, dp: int, steps: int | None):
    """Every rank's steps (simulated ranks) from ``cursor``: (ids seen in order, new cursor, steps run)."""
    iters = [src.epoch_steps(epoch, cursor, BatchPlan.of(micro, accum, dp, r)) for r in range(dp)]
    seen, n = [], 0
    while steps is None or n < steps:
        got = [next(it, None) for it in iters]
        if got[0] is None:
            assert all(g is None for g in got), "ranks yield different numbers of steps"
            break
        assert len({g.global_samples for g in got}) == 1
        step_ids = []
        for g in got:
            assert len(g.micro) == accum and len(g.ids) == accum
            for (x, y), ids in zip(g.micro, g.ids):
                assert len(x) == len(y) == len(ids) <= micro and x.shape[1] == FEATURES
                # The rows read are the rows named: feature f0 is the row's id, label id % 3.
                assert np.array_equal(x[:, 0].numpy().astype(np.int64), ids.numpy())
                assert np.array_equal(y.numpy(), ids.numpy() % 3)
                step_ids += ids.tolist()
        assert len(step_ids) == got[0].global_samples
        seen += step_ids
        cursor += got[0].global_samples
        n += 1
    for it in iters:
        it.close()
    return seen, cursor, n


def test_every_sample_exactly_once_across_a_2_1_2_resize(data):
    src = source(data)
    order = src.global_order(0)
    assert sorted(order.tolist()) == sorted(np.concatenate([src.train_ids(u) for u in range(16)]).tolist())
    # dp 2 x micro 8 (G 16), then one rank with micro 4 x accum 4 (G 16), then dp 2 x micro 5 x accum 2 (G 20).
    a, c1, _ = run_steps(src, 0, 0, 8, 1, 2, steps=7)
    assert c1 == 112 and sorted(a) == sorted(order[:c1].tolist())
    b, c2, _ = run_steps(source(data), 0, c1, 4, 4, 1, steps=9)  # a fresh source: rebuilt from the cursor alone
    assert sorted(b) == sorted(order[c1:c2].tolist())
    c, end, _ = run_steps(source(data), 0, c2, 5, 2, 2, steps=None)
    seen = a + b + c
    assert end == len(src) and len(seen) == len(src)
    assert Counter(seen).most_common(1)[0][1] == 1  # nothing twice, and with the length: nothing skipped


def test_each_step_consumes_the_next_slice_of_one_order_whatever_the_plan(data):
    src = source(data)
    order = src.global_order(1)
    for micro, accum, dp in [(16, 1, 1), (8, 1, 2), (4, 2, 2), (2, 4, 2)]:
        seen, end, steps = run_steps(src, 1, 0, micro, accum, dp, steps=None)
        assert end == len(src) and steps == -(-len(src) // 16)
        for s in range(steps):  # step s holds exactly positions [16 s, 16 s + 16) of the order
            assert sorted(seen[16 * s:16 * s + 16]) == sorted(order[16 * s:16 * s + 16].tolist())


def test_the_order_is_seeded_per_epoch_and_repeatable(data):
    src = source(data)
    assert np.array_equal(src.global_order(2), source(data).global_order(2))
    assert not np.array_equal(src.global_order(2), src.global_order(3))
    assert not np.array_equal(src.global_order(2), source(data, seed=1).global_order(2))


def test_no_sample_moves_further_than_its_window(data):
    window = 4
    src = source(data, window=window, val_fraction=0.0)
    units, _ = src._layout(0)
    # Position of each id when row groups are only permuted, not shuffled inside a window.
    unshuffled = np.concatenate([src.train_ids(int(u)) for u in units])
    where = np.empty(ROWS, dtype=np.int64)
    where[unshuffled] = np.arange(ROWS)
    moved = np.abs(np.arange(ROWS) - where[src.global_order(0)])
    assert moved.max() < window * GROUP  # bounded by one window's rows ...
    assert moved.max() > GROUP  # ... and rows do mix across row groups inside it
    # Each window holds exactly its row groups' rows.
    _, starts = src._layout(0)
    for lo, hi in zip(starts[:-1], starts[1:]):
        assert set(src.global_order(0)[lo:hi].tolist()) == set(unshuffled[lo:hi].tolist())


def test_a_rank_reads_its_share_of_a_window_not_all_of_it(data):
    window = 8
    reads = [Counter(), Counter()]
    for r in range(2):
        src = source(data, window=window, val_fraction=0.0, reads=reads[r])
        for _ in src.epoch_steps(0, 0, BatchPlan.of(64, 1, 2, r)):  # G 128: ~16 rows of each row group a step
            pass
    for r in range(2):
        assert max(reads[r].values()) == 1  # each row group read once per epoch
        # About window / dp + 1 of each window's 8 (16 row groups in 2 windows), not all 16.
        assert sum(reads[r].values()) <= 2 * (window // 2 + 2)
    assert set(reads[0]) | set(reads[1]) == set(range(16))


def test_prefetch_and_direct_reads_give_the_same_batches(data):
    a, _, _ = run_steps(source(data, prefetch=True), 0, 40, 6, 1, 2, steps=None)
    b, _, _ = run_steps(source(data, prefetch=False), 0, 40, 6, 1, 2, steps=None)
    assert a == b


def test_held_out_rows_are_disjoint_from_training_and_bounded(data):
    src = source(data, val_fraction=0.2, val_rows=50)
    x, y = src.held_out()
    held = set(x[:, 0].astype(np.int64).tolist())
    assert held and held.isdisjoint(src.global_order(0).tolist())
    assert len(held) + len(src) == ROWS
    assert len(held) < 50 + 0.2 * 2 * GROUP  # the cap, plus at most one row group's share


def test_last_step_is_short_and_every_rank_yields_its_micro_batches(data):
    src = source(data)
    n = len(src)
    plan = BatchPlan.of(7, 3, 2, 1)  # G 42: n is no multiple of it
    steps = list(src.epoch_steps(0, 0, plan))
    assert len(steps) == plan.steps(n)
    assert steps[-1].global_samples == n % 42 or n % 42 == 0
    assert all(len(s.micro) == 3 for s in steps)


def test_a_cursor_outside_the_epoch_is_refused(data):
    with pytest.raises(ValueError, match="outside"):
        next(source(data).epoch_steps(0, ROWS + 1, BatchPlan.of(4, 1, 1)))


def test_a_folder_without_parquet_is_unavailable(tmp_path):
    with pytest.raises(DataUnavailableError):
        scan_row_groups(tmp_path)


# -- config and the loader choice ---------------------------------------------------------------
def cfg_for(folder: str, **loader):
    return config_from_dict({"name": "x", "dataset": {"path": folder, "train_file": "train.parquet",
                                                      "test_file": "test.parquet"},
                             "training": {"loader": loader or "auto"}})


def test_auto_streams_only_a_train_split_above_the_threshold(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"f0": np.arange(20_000.0)}), tmp_path / "d" / "train.parquet")
    kind, why = choose_loader(cfg_for("d"), tmp_path)
    assert kind == "memory" and "stream_above_mb 1024" in why
    kind, why = choose_loader(cfg_for("d", kind="auto", stream_above_mb=0.01), tmp_path)
    assert kind == "stream" and "> stream_above_mb 0.01" in why
    assert choose_loader(cfg_for("d", kind="stream"), tmp_path)[0] == "stream"
    one_file = config_from_dict({"name": "x", "dataset": {"path": "d", "file": "train.parquet"},
                                 "training": {"loader": {"kind": "auto", "stream_above_mb": 0.01}}})
    assert choose_loader(one_file, tmp_path)[0] == "memory"  # a file split by seed is split in memory


def test_loader_keys_are_checked_and_new_keys_keep_old_config_ids():
    assert cfg_for("d").training.loader.kind == "auto"  # `loader: auto` is short for {kind: auto}
    with pytest.raises(ConfigError, match=r"training\.loader\.kind: 'stream' has no workers"):
        cfg_for("d", kind="stream", num_workers=2)
    with pytest.raises(ConfigError, match=r"training\.loader\.shuffle_row_groups: must be > 0"):
        cfg_for("d", kind="stream", shuffle_row_groups=0)
    with pytest.raises(ConfigError, match=r"training\.loader\.kind: must be one of"):
        cfg_for("d", kind="disk")
    from core.config import config_id_of

    cfg = config_from_dict({"name": "x", "dataset": {"path": "d"}})
    old = cfg.model_dump(mode="json")
    for key in ("stream_above_mb", "shuffle_row_groups", "val_rows", "csv_parquet_above_mb"):
        del old["training"]["loader"][key]  # a config.json written before these keys existed
    assert config_id_of(old) == cfg.config_id()
    changed = config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"loader": {"val_rows": 5}}})
    assert changed.config_id() != cfg.config_id()


def test_a_large_csv_is_converted_once_into_the_cache_keyed_by_its_md5(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    csv = tmp_path / "train.csv"
    csv.write_text("a,b,label\n" + "".join(f"{i},{i * 0.5},{i % 2}\n" for i in range(250)))
    md5 = "0123456789abcdef0123456789abcdef.dir"
    out = csv_to_parquet(csv, tmp_path, md5, row_group_rows=100)
    assert out.is_relative_to(tmp_path / "home" / "cache" / "parquet")
    pf = pq.ParquetFile(out)
    assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == [100, 100, 50]
    table = pf.read()
    assert table.column("a").to_pylist() == [float(i) for i in range(250)]
    stamp = out.stat().st_mtime_ns
    assert csv_to_parquet(csv, tmp_path, md5, row_group_rows=100) == out and out.stat().st_mtime_ns == stamp
    with pytest.raises(DataUnavailableError, match="not a DVC md5"):
        csv_to_parquet(csv, tmp_path, "../../etc")
    from tasks.table_stream import parquet_source

    # Streaming a CSV: above the threshold its cached Parquet copy, below it refused (load it in memory).
    assert parquet_source(csv, tmp_path, md5, csv_above_mb=0).suffix == ".parquet"
    with pytest.raises(DataUnavailableError, match="csv_parquet_above_mb"):
        parquet_source(csv, tmp_path, md5, csv_above_mb=1)


def test_row_groups_are_read_in_the_background_and_memory_holds_about_one_window(data):
    import threading
    import weakref

    alive, threads, peak = [0], set(), 0  # row-group arrays alive now (a finalizer counts each one out)
    groups = scan_row_groups(data)
    inner = table_reader(groups, ["f0", "f1", "f2"], "label", lambda col: col.to_numpy().astype(np.int64))

    def read(u):
        threads.add(threading.current_thread().name)
        x, y = inner(u)
        alive[0] += 1
        weakref.finalize(x, lambda: alive.__setitem__(0, alive[0] - 1))
        return x, y

    window = 4
    src = StreamSource(groups, read, seed=0, window=window, holdout=Holdout(groups, 0, 0.0, 1),
                       n_features=FEATURES, y_dtype=np.int64)
    for _ in src.epoch_steps(0, 0, BatchPlan.of(8, 1, 2, 0)):
        peak = max(peak, alive[0])
    assert threads and all(name.startswith("trainflow-stream") for name in threads)
    # This rank's share of one window (at most all of it) and the row groups read ahead: not the 16
    # of the data. A step that spans two windows drops the one it leaves before it reads the next's.
    from training.stream import PREFETCH_ROW_GROUPS

    assert 2 <= peak <= window + PREFETCH_ROW_GROUPS


@pytest.mark.parametrize("rank", [0, 1])
def test_every_rank_drops_a_row_group_after_its_last_use_not_at_its_windows_end(tmp_path, rank):
    """At a step crossing into the next window the later rank's share reads a few rows of each of
    that window's row groups, of which its later steps read only about half: the others are
    dropped after that step (they were held until the window ended: 11 instead of 7 at 5 M rows)."""
    import weakref

    from training.stream import PREFETCH_ROW_GROUPS

    folder = write_table(tmp_path / "t", rows=64 * 64, group=64)  # 64 row groups, 8 windows of 8
    groups = scan_row_groups(folder)
    inner = table_reader(groups, ["f0", "f1", "f2"], "label", lambda col: col.to_numpy().astype(np.int64))
    alive, peak, reads = [0], 0, Counter()

    def read(u):
        x, y = inner(u)
        alive[0] += 1
        reads[u] += 1
        weakref.finalize(x, lambda: alive.__setitem__(0, alive[0] - 1))
        return x, y

    window = 8
    src = StreamSource(groups, read, seed=0, window=window, holdout=Holdout(groups, 0, 0.0, 1),
                       n_features=FEATURES, y_dtype=np.int64)
    # G 192: ~24 rows of each of a window's row groups a step; every 2nd or 3rd step crosses into the next window.
    for _ in src.epoch_steps(0, 0, BatchPlan.of(96, 1, 2, rank)):
        peak = max(peak, alive[0])
    assert max(reads.values()) == 1  # dropped only after its last use: never read twice
    # This rank's share of a window (about window / 2 + 1 row groups) and those read ahead.
    assert peak <= window // 2 + 1 + PREFETCH_ROW_GROUPS, peak


@pytest.mark.parametrize("task_name", ["classification", "regression"])
def test_streamed_info_equals_the_in_memory_info(tmp_path, task_name):
    """The model's facts (features, dtypes, scaling, classes or target scale) fitted in one streamed
    pass equal what the task fits on the loaded split."""
    from tasks import get_task

    d = write_table(tmp_path / "d", rows=500, group=64)
    (d / "part-00.parquet").rename(d / "train.parquet")
    write_table(tmp_path / "t", rows=50)
    (tmp_path / "t" / "part-00.parquet").rename(d / "test.parquet")
    label = "label" if task_name == "classification" else "f2"
    cols = [c for c in ("f0", "f1", "f2", "label") if c != label]
    types = {"f0": "float", "f1": "float", "f2": "float", "label": "integer"}
    (tmp_path / "exp.yaml").write_text(f"label: {label}\ncolumns:\n" + "".join(
        f"  - {{name: {c}, type: {types[c]}}}\n" for c in [*cols, label]))
    cfg = config_from_dict({"name": "t", "task": task_name, "dataset": {
        "path": "d", "train_file": "train.parquet", "test_file": "test.parquet", "label": label,
        "expectations_file": "exp.yaml"}})
    task = get_task(task_name)
    want = task.info(cfg, tmp_path, task.frames(cfg, tmp_path))
    groups = scan_row_groups(d / "train.parquet")
    got = task.stream_info(cfg, tmp_path, d / "train.parquet", groups.names, groups.types)
    got, want = got.to_json(), want.to_json()
    assert got.keys() == want.keys()
    for key in want:
        if key in ("mean", "std"):
            assert np.allclose(got[key], want[key], rtol=1e-9)
        elif key in ("y_mean", "y_std") and want[key] is not None:
            assert got[key] == pytest.approx(want[key], rel=1e-9)
        elif key == "columns":  # moments merged batch by batch: equal to float64 rounding
            for g, w in zip(got[key], want[key], strict=True):
                assert g.keys() == w.keys()
                for k in w:
                    assert g[k] == (pytest.approx(w[k], rel=1e-9) if k in ("mean", "std", "iqr") else w[k]), k
        else:
            assert got[key] == want[key], key


def test_a_task_without_a_table_cannot_stream_and_auto_keeps_it_in_memory(repo_root, caplog):
    from core.config import load_config
    from training.data import load_splits

    cfg = load_config(repo_root / "configs" / "stdlib-lm.yaml", ["training.loader.kind=stream"])
    with pytest.raises(ConfigError, match=r"training\.loader\.kind: 'stream' reads tables; task 'lm'"):
        load_splits(cfg, repo_root, 0)
    auto = load_config(repo_root / "configs" / "stdlib-lm.yaml", ["training.loader=auto"])
    with caplog.at_level("INFO", logger="trainflow.train"), pytest.raises(DataUnavailableError):
        load_splits(auto, Path("/nonexistent"), 0)  # in memory: the corpus is read (and missing here)
    assert "training.loader: memory (auto: task 'lm' has no table to stream)" in caplog.text


def test_a_row_group_that_cannot_be_read_fails_the_step_that_needs_it(data):
    groups = scan_row_groups(data)
    inner = table_reader(groups, ["f0", "f1", "f2"], "label", lambda col: col.to_numpy().astype(np.int64))

    def read(u):
        if u == 5:
            raise DataUnavailableError("row group 5 is corrupt")
        return inner(u)

    src = StreamSource(groups, read, seed=0, window=4, holdout=Holdout(groups, 0, 0.0, 1),
                       n_features=FEATURES, y_dtype=np.int64)
    with pytest.raises(DataUnavailableError, match="row group 5"):
        for _ in src.epoch_steps(0, 0, BatchPlan.of(8, 1, 1, 0)):  # the background read's error, here
            pass


def test_the_streamed_info_pass_runs_once_per_data(tmp_path, monkeypatch):
    from tasks.tabular import Classification
    from training.stream import stream_splits

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    d = write_table(tmp_path / "d", rows=300, group=64)
    (d / "part-00.parquet").rename(d / "train.parquet")
    (tmp_path / "exp.yaml").write_text("label: label\ncolumns:\n" + "".join(
        f"  - {{name: {c}, type: float}}\n" for c in ("f0", "f1", "f2")) + "  - {name: label, type: integer}\n")
    cfg = config_from_dict({"name": "t", "dataset": {"path": "d", "train_file": "train.parquet",
                                                     "test_file": "test.parquet", "expectations_file": "exp.yaml"},
                            "training": {"loader": "stream"}})
    passes = []
    real = Classification.stream_info
    monkeypatch.setattr(Classification, "stream_info", lambda self, *a: passes.append(1) or real(self, *a))
    first = stream_splits(cfg, tmp_path, 0, "0" * 32)
    again = stream_splits(cfg, tmp_path, 0, "0" * 32)  # another rank, or the next run
    assert len(passes) == 1 and again.info == first.info and first.info.classes == [0, 1, 2]
    assert len(first.train) + len(first.val) == 300


def test_a_streamed_string_column_gets_the_vocabulary_and_codes_of_the_in_memory_path(tmp_path):
    """Categories in a table beyond memory: counted in the one streamed pass, and each row group
    encoded with the task's codes, exactly as the loaded split is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks import get_task

    rng = np.random.default_rng(0)
    d = tmp_path / "d"
    d.mkdir()
    for name, n in (("train", 700), ("test", 70)):
        city = rng.choice(["oslo", "rome", "lima", None], n).tolist()
        pq.write_table(pa.table({"x": rng.normal(size=n), "city": pa.array(city, pa.string()),
                                 "label": rng.integers(0, 2, n)}), d / f"{name}.parquet", row_group_size=64)
    (tmp_path / "exp.yaml").write_text("label: label\ncolumns:\n  - {name: x, type: float}\n"
                                       "  - {name: city, type: string, nulls: true}\n"
                                       "  - {name: label, type: integer, values: [0, 1]}\n")
    cfg = config_from_dict({"name": "t", "dataset": {"path": "d", "train_file": "train.parquet",
                                                     "test_file": "test.parquet", "expectations_file": "exp.yaml"}})
    task = get_task("classification")
    want = task.info(cfg, tmp_path, task.frames(cfg, tmp_path))
    groups = scan_row_groups(d / "train.parquet")
    got = task.stream_info(cfg, tmp_path, d / "train.parquet", groups.names, groups.types)
    assert got.columns[1] == want.columns[1] and got.columns[1]["values"] == ["lima", "oslo", "rome"]
    assert got.dtypes == want.dtypes == {"x": "double", "city": "string"}
    read = table_reader(groups, got.features, "label", lambda col: col.to_numpy().astype(np.int64),
                        lambda frame: task.features_of(frame, got))
    x0, _ = read(0)
    np.testing.assert_array_equal(x0, task.prepared(cfg, tmp_path)["x"][:64])
