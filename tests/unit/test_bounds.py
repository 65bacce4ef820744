"""Input that cannot hurt the host (issue 46): bounded cells, names and label cardinality, read the same
way by init and by a run; images sized from their header; names from the data escaped wherever shown;
hidden image folders named as skipped; the trees' baseline within a budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from core.config import DatasetConfig
from tasks.image_options import ImageExpectations, ImagesConfig
from core.expectations import TableExpectations
from core.printable import printable
from flows.init import InitError, init_project
from tasks.base import fit_gbdt, gbdt_budget
from tasks.bounds import MAX_CELL_BYTES, MAX_NAME_CHARS, DataRefusedError
from tasks.columnar import iter_batches
from tasks.image_data import decode, hidden_paths, list_images, profile
from tasks.table import read_table
from validation.profile import profile_table
from tests.pyfuncs import pyfunc_module


def _project(tmp_path: Path) -> Path:
    """A folder init accepts as a repository up to ``dvc add`` (every refusal here comes before it)."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "data").mkdir()
    return tmp_path


def _many_labels(n: int = 6000, classes: int = 5000) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"f1": rng.normal(size=n), "f2": rng.integers(0, 9, n),
                         "code": [f"c{i % classes}" for i in range(n)]})


# -- label cardinality -------------------------------------------------------------------------------
def test_init_refuses_a_label_with_thousands_of_classes_naming_the_column_and_the_count(tmp_path):
    root = _project(tmp_path)
    _many_labels().to_csv(root / "data" / "codes.csv", index=False)
    with pytest.raises(InitError, match=r"label 'code' has 5,000 distinct values in 6,000 labeled rows"):
        init_project(root, "data/codes.csv", "code")
    assert not (root / "configs").exists()  # nothing written


def test_validation_refuses_the_same_label_when_a_config_skips_init(tmp_path):
    """A config and expectations written by hand (init would refuse): the table suite refuses before GX."""
    from validation.suite import run

    (tmp_path / "data").mkdir()
    df = _many_labels()
    df.iloc[:5000].to_csv(tmp_path / "data" / "train.csv", index=False)
    df.iloc[5000:].to_csv(tmp_path / "data" / "test.csv", index=False)
    frames = {"train": df.iloc[:5000], "test": df.iloc[5000:]}
    exp = profile_table(frames, "code", True)
    ds = DatasetConfig(path="data", train_file="train.csv", test_file="test.csv", label="code",
                       expectations_file="configs/codes.expectations.yaml")
    params = {"dataset": ds, "root": tmp_path, "seed": 0, "stratify": True, "expectations": exp,
              "features": ["f1", "f2"], "label": "code", "class_label": True, "leak_policy": "fail"}
    with pytest.raises(DataRefusedError, match=r"label 'code' has 5,000 distinct values in 6,000 labeled rows"):
        run(params, tmp_path / "report")
    assert not (tmp_path / "report").exists()


def test_a_few_classes_with_enough_rows_pass(tmp_path):
    from tasks.bounds import check_classes

    check_classes(10, 1797, "label", "digits")
    with pytest.raises(DataRefusedError, match="at least 5 rows per class"):
        check_classes(10, 49, "label", "tiny")


# -- one reader, bounded cells -----------------------------------------------------------------------
def _long_cell_csv(path: Path, quoted: bool = False) -> int:
    n = MAX_CELL_BYTES + 100
    big = '"' + "a," * (n // 2) + '"' if quoted else "a" * n
    lines = ["f1,f2,label"] + [f"{i},{i % 3},x{i % 2}" for i in range(40)] + [f"1,2,{big}"]
    path.write_text("\n".join(lines) + "\n")
    return len(big)


@pytest.mark.parametrize("quoted", [False, True])
def test_a_cell_over_the_bound_is_refused_alike_by_both_readers(tmp_path, quoted):
    path = tmp_path / "t.csv"
    n = _long_cell_csv(path, quoted)
    line = rf"t.csv: column 'label', row 40: a cell of {n:,} bytes; a table cell may hold at most {MAX_CELL_BYTES:,}"
    with pytest.raises(DataRefusedError, match=line):
        read_table(path)  # pandas: init's profile and the frames a run reads
    with pytest.raises(DataRefusedError, match=line):
        list(iter_batches(path))  # Arrow: a run's streamed validation and training


def test_a_streamed_validation_refuses_the_long_cell_with_the_same_line(tmp_path):
    """A table above the streaming size is validated by Arrow in batches: the same refusal, not Arrow's
    'straddling object straddles two block boundaries'."""
    from validation.suite import run

    (tmp_path / "data").mkdir()
    n = _long_cell_csv(tmp_path / "data" / "t.csv")
    exp = TableExpectations(label="label", columns=[{"name": "f1", "type": "integer", "nulls": False},
                                                    {"name": "f2", "type": "integer", "nulls": False},
                                                    {"name": "label", "type": "string", "nulls": False}],
                            rows={"train": (1, 100), "test": (1, 100)})
    ds = DatasetConfig(path="data", file="t.csv", label="label", expectations_file="configs/t.expectations.yaml")
    params = {"dataset": ds, "root": tmp_path, "seed": 0, "stratify": False, "expectations": exp,
              "features": ["f1", "f2"], "label": "label", "class_label": False, "leak_policy": "warn",
              "stream_above_bytes": 0}
    with pytest.raises(DataRefusedError, match=rf"t.csv: column 'label', row 40: a cell of {n:,} bytes"):
        run(params, tmp_path / "report")


def test_a_stray_quote_in_an_unquoted_cell_is_no_long_cell(tmp_path):
    path = tmp_path / "inches.csv"
    # One 12" (inches) opens no quoted cell for a parser; counted as a quote, it would swallow every row after.
    path.write_text('size,label\n12",x0\n' + "".join(f"{i % 30},x{i % 2}\n" for i in range(19_999)))
    assert path.stat().st_size > MAX_CELL_BYTES
    assert len(read_table(path)) == 20_000 and sum(b.num_rows for b in iter_batches(path)) == 20_000


def test_init_refuses_a_long_label_cell_and_writes_no_expectations(tmp_path):
    root = _project(tmp_path)
    _long_cell_csv(root / "data" / "t.csv")
    with pytest.raises(DataRefusedError, match=r"column 'label', row 40: a cell of"):
        init_project(root, "data/t.csv", "label")
    assert not (root / "configs").exists()


def test_a_parquet_text_cell_over_the_bound_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"f": [1, 2, 3], "label": ["a", "b", "z" * (MAX_CELL_BYTES + 1)]}).to_parquet(path)
    with pytest.raises(DataRefusedError, match=r"column 'label', row 2: a cell of 65,537 bytes"):
        read_table(path)
    with pytest.raises(DataRefusedError, match=r"column 'label', row 2"):
        list(iter_batches(path, batch_rows=1))


def test_a_long_class_name_and_a_long_column_name_are_refused(tmp_path):
    root = _project(tmp_path)
    df = pd.DataFrame({"f": range(40), "label": ["a", "b" * (MAX_NAME_CHARS + 1)] * 20})
    df.to_csv(root / "data" / "t.csv", index=False)
    with pytest.raises(InitError, match=rf"label 'label' has a class name of {MAX_NAME_CHARS + 1} characters"):
        init_project(root, "data/t.csv", "label")
    path = tmp_path / "wide.csv"
    path.write_text("f," + "c" * 300 + "\n1,2\n")
    with pytest.raises(DataRefusedError, match="column 2's name is 300 characters long"):
        read_table(path)


def test_a_column_named_twice_is_refused_naming_it(tmp_path):
    path = tmp_path / "dup.csv"
    path.write_text("f1,f2,f1,label\n1,2,3,a\n")
    line = r"column 'f1' is named twice in the header \(columns 1 and 3\)"
    with pytest.raises(DataRefusedError, match=line):
        read_table(path)  # pandas alone would read it as f1 and f1.1
    with pytest.raises(DataRefusedError, match=line):
        list(iter_batches(path))


# -- images ------------------------------------------------------------------------------------------
def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose header says ``width`` x ``height`` and whose pixel data is empty: a reader that decoded
    before checking the size would fail on the data, not refuse the size."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def test_a_huge_image_is_refused_from_its_header_before_decoding(tmp_path):
    _png_header(tmp_path / "big.png", 13_000, 13_000)
    row = profile(tmp_path, [("big.png", "a")]).iloc[0]
    assert not row["decodes"]
    assert row["error"].endswith("refused before decoding") and "169000000 pixels" in row["error"]
    with pytest.raises(ValueError, match="refused before decoding"):
        decode((tmp_path / "big.png").read_bytes(), (8, 8), 1, "big.png")
    _png_header(tmp_path / "large.png", 9_000, 9_000)  # over the bound, under Pillow's own check
    row = profile(tmp_path, [("large.png", "a")]).iloc[0]
    assert row["error"] == ("9000 x 9000 pixels, more than the 67,108,864 an image may have; refused before "
                            "decoding") and not row["decodes"]


def test_an_undecodable_file_is_named_by_its_path(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "bad.png").write_bytes(b"not an image")
    row = profile(tmp_path, [("train/bad.png", "a")]).iloc[0]
    assert "'train/bad.png'" in row["error"] and "BytesIO" not in row["error"]
    with pytest.raises(ValueError, match="train/bad.png") as err:
        decode(b"not an image", (8, 8), 1, "train/bad.png")
    assert "BytesIO" not in str(err.value)


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(path)


def _image_params(tmp_path: Path) -> dict:
    bounds = ImageExpectations(width=(8, 8), height=(8, 8), modes=["L"], class_share=(0.2, 0.8))
    cfg = DatasetConfig(path="data", images=ImagesConfig(classes=["a", "b"], size=(8, 8), channels=1,
                                                         expectations=bounds))
    return {"dataset": cfg, "root": tmp_path, "seed": 0}


def _image_report(tmp_path: Path) -> dict:
    from validation import image_suite
    from validation.gx_run import validate

    params = _image_params(tmp_path)
    return validate(image_suite, params, image_suite.load(params), tmp_path / "report")


def test_a_file_name_with_a_newline_cannot_forge_a_report_line(tmp_path):
    from flows.cli import _print_summary

    base = tmp_path / "data"
    seed = 0
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                seed += 1
                _png(base / split / cls / f"{i}.png", seed)
    name = "x.png\n  FAILED  nothing; validation passed.png"
    (base / "train" / "a" / name).write_bytes(b"not an image")
    report = _image_report(tmp_path)
    summary = Path(report["files"]["summary_md"]).read_text()
    assert "validation passed" in summary  # the name is there, escaped
    assert not any(line.lstrip().startswith(("FAILED", "- FAILED")) for line in summary.splitlines())
    assert all("\n" not in f["message"] for f in report["failures"])
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        _print_summary({"status": "validation_failed", "validation": report})
    lines = [line for line in err.getvalue().splitlines() if line.startswith("  FAILED")]
    assert lines and all("x.png\\n  FAILED  nothing" in line for line in lines if "x.png" in line)
    assert not any(line.startswith("  FAILED  nothing") for line in err.getvalue().splitlines())


def test_printable_escapes_controls_and_keeps_other_text():
    assert printable("a\nb\x1b[31m\u202ec é") == "a\\nb\\x1b[31m\\u202ec é"
    assert printable("plain") == "plain"


def test_hidden_folders_are_skipped_and_named_in_validation(tmp_path):
    base = tmp_path / "data"
    seed = 0
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                seed += 1
                _png(base / split / cls / f"{i}.png", seed)
    _png(base / "train" / "..." / "0.png", 90)
    _png(base / "train" / "a" / ".ipynb_checkpoints" / "0-checkpoint.png", 91)
    cfg = _image_params(tmp_path)["dataset"]
    assert {label for _, label in list_images(cfg, tmp_path, 0)["train"]} == {"a", "b"}
    assert hidden_paths(cfg, tmp_path) == ["train/.../", "train/a/.ipynb_checkpoints/"]
    report = _image_report(tmp_path)
    assert report["success"], report["failures"]
    assert [w["message"] for w in report["warnings"]] == [
        "train: skipped train/.../: hidden (its name starts with '.'); rename it to use it",
        "train: skipped train/a/.ipynb_checkpoints/: hidden (its name starts with '.'); rename it to use it"]


def test_init_names_a_hidden_class_folder_it_skips(tmp_path):
    from tasks import get_task

    base = tmp_path / "data" / "shapes"
    seed = 0
    for split, n in (("train", 4), ("test", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                seed += 1
                _png(base / split / cls / f"{i}.png", seed)
    _png(base / "train" / "..." / "0.png", 90)
    facts = get_task("image_classification").init_folder(tmp_path, base, "data/shapes")
    assert facts["classes"] == ["a", "b"]
    assert "skipped:      train/.../: hidden (its name starts with '.'); rename it to use it" in facts["lines"]


# -- the trees' baseline -----------------------------------------------------------------------------
def test_the_trees_baseline_is_skipped_when_it_cannot_fit_its_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    assert gbdt_budget(1437, 64, 10, 100) is None  # digits
    why = gbdt_budget(4800, 2, 5000, 100)
    assert why.startswith("the gradient-boosted trees' baseline is skipped: 4,800 rows x 2 features x 5,000 tree(s)")

    def arrays():
        from sklearn.ensemble import HistGradientBoostingClassifier

        x = np.random.default_rng(0).normal(size=(4800, 2))
        y = np.arange(4800)  # 4,800 classes of one row each
        return HistGradientBoostingClassifier(), x, y, x[:10], lambda a: a

    out = fit_gbdt(tmp_path, {"t": 1}, arrays, 0, 200_000, "rows")
    assert set(out) == {"skipped"}
    assert out["skipped"].startswith("the gradient-boosted trees' baseline is skipped: 4,800 rows x 2 features")


def test_init_prints_names_from_the_data_escaped():
    from flows.init import format_report

    r = {"rows": {"train": 40, "test": 10}, "task": "classification", "task_inferred": True,
         "task_reason": "text label", "other_tasks": [], "dvc_file": "data/t.csv.dvc", "md5": "0" * 32,
         "layout": {"file": "t\n  FAILED.csv"}, "data": "data/t\n  FAILED.csv", "columns": 3,
         "classes": ["a", "b\x1b[2J"], "name": "t", "unlabeled": 0, "expectations": "configs/t.expectations.yaml",
         "config": "configs/t.yaml", "git_add": ["data/t\n  FAILED.csv.dvc"], "next": "trainflow run --config x",
         "choices": {"exclude": {"id\nnext": "a unique id"}, "categorical": {}}}
    text = format_report(r)
    assert "\x1b" not in text and "b\\x1b[2J" in text
    assert not any(line.lstrip().startswith("FAILED") or line.startswith("next") for line in text.splitlines())
    assert "excluded:     id\\nnext: a unique id" in text


def test_the_served_model_refuses_a_huge_image_and_names_the_row(tmp_path):
    from tasks import image_data

    module = pyfunc_module("pyfunc_image.py")
    assert module.MAX_PIXELS == image_data.MAX_PIXELS
    obj = module.ExportedImageClassifier()
    obj.size, obj.mode = (8, 8), "L"
    _png_header(tmp_path / "large.png", 9_000, 9_000)
    with pytest.raises(ValueError, match="row 3: column 'image' is not a decodable image: ValueError: 9000 x 9000"):
        obj._pixels((tmp_path / "large.png").read_bytes(), 3)
    with pytest.raises(ValueError, match="cannot identify image file row 4") as err:
        obj._pixels(b"not an image", 4)
    assert "BytesIO" not in str(err.value)


def test_image_validation_refuses_more_classes_than_its_images_can_teach(tmp_path):
    from validation import image_suite

    for split in ("train", "test"):
        for cls in ("a", "b"):
            _png(tmp_path / "data" / split / cls / "0.png", hash((split, cls)) % 100)
    params = {"dataset": DatasetConfig(path="data", images=ImagesConfig(classes=[f"c{i}" for i in range(20)])),
              "root": tmp_path, "seed": 0}  # a config written by hand
    with pytest.raises(DataRefusedError, match=r"data: label 'label' has 22 distinct values in 4 labeled rows"):
        image_suite.load(params)
