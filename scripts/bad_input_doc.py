"""Write the generated blocks of docs/bad-input.md and docs/security.md: each refusal that protects the
host (issue 46), produced by running this checkout's code on a tiny bad input.

    python scripts/bad_input_doc.py            # rewrite the blocks in both pages
    python scripts/bad_input_doc.py --check    # exit 1 when a page differs from what the code says

Only the text between ``<!-- bad-input:generated:start -->`` and ``<!-- bad-input:generated:end -->``
(``security:generated`` in docs/security.md) is written; the rest of each page is by hand.
``tests/unit/test_docs.py`` compares both pages with a fresh render, in-process.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAGES = {"bad-input.md": "bad-input", "security.md": "security"}


def _refusal(call: Callable[[], object]) -> str:
    """The message of the error ``call`` raises (it must raise a TrainflowError or ValueError)."""
    from core.errors import TrainflowError

    try:
        call()
    except (TrainflowError, ValueError) as exc:
        return str(exc)
    raise AssertionError(f"{call} accepted bad input")


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose header says ``width`` x ``height`` (and no pixels): what a reader sees before decoding."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


def _png(path: Path, seed: int) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (8, 8), dtype=np.uint8), "L").save(path)


def _tables(tmp: Path) -> list[tuple[str, str, str]]:
    import numpy as np
    import pandas as pd

    from core.config import DatasetConfig
    from flows.init import init_project
    from tasks.bounds import MAX_CELL_BYTES, MAX_NAME_CHARS
    from tasks.columnar import iter_batches
    from tasks.table import read_table
    from validation.profile import profile_table
    from validation.suite import run

    (tmp / ".dvc").mkdir()
    data = tmp / "data"
    data.mkdir()
    n = 6000
    codes = pd.DataFrame({"f1": np.arange(n) / n, "code": [f"c{i % 5000}" for i in range(n)]})
    codes.to_csv(data / "codes.csv", index=False)
    rows = [("a classification label with 5,000 distinct values in 6,000 rows", "`trainflow init`",
             _refusal(lambda: init_project(tmp, "data/codes.csv", "code")))]
    codes.iloc[:5000].to_csv(data / "train.csv", index=False)
    codes.iloc[5000:].to_csv(data / "test.csv", index=False)
    ds = DatasetConfig(path="data", train_file="train.csv", test_file="test.csv", label="code",
                       expectations_file="configs/codes.expectations.yaml")
    exp = profile_table({"train": codes.iloc[:5000], "test": codes.iloc[5000:]}, "code", True)
    params = {"dataset": ds, "root": tmp, "seed": 0, "stratify": True, "expectations": exp, "features": ["f1"],
              "label": "code", "class_label": True, "leak_policy": "fail"}
    rows.append(("the same data under a config and expectations written by hand", "`trainflow run`: validation, "
                 "before any check runs", _refusal(lambda: run(params, tmp / "report"))))

    lines = ["f1,label"] + [f"{i},x{i % 2}" for i in range(40)] + ["1," + "a" * (MAX_CELL_BYTES + 100)]
    (data / "long.csv").write_text("\n".join(lines) + "\n")
    pandas, arrow = (_refusal(lambda: read_table(data / "long.csv")),
                     _refusal(lambda: list(iter_batches(data / "long.csv"))))
    assert pandas == arrow, (pandas, arrow)  # init's reader and a streamed run's say the same
    rows.append((f"a CSV cell over {MAX_CELL_BYTES // 1024} KiB (here the last label cell; a 200 MB one the same)",
                 "`trainflow init` and `trainflow run` (both readers)", pandas))
    pd.DataFrame({"f1": [1, 2], "label": ["a", "b" * (MAX_CELL_BYTES + 1)]}).to_parquet(data / "long.parquet")
    rows.append(("a Parquet text cell over the same bound", "`trainflow init` and `trainflow run`",
                 _refusal(lambda: read_table(data / "long.parquet"))))
    (data / "wide.csv").write_text("f1," + "c" * (MAX_NAME_CHARS + 44) + "\n1,2\n")
    rows.append((f"a column name over {MAX_NAME_CHARS} characters", "`trainflow init` and `trainflow run`",
                 _refusal(lambda: read_table(data / "wide.csv"))))
    (data / "dup.csv").write_text("f1,f2,f1,label\n1,2,3,a\n")
    rows.append(("a column named twice (pandas alone would read `f1` and `f1.1`)",
                 "`trainflow init` and `trainflow run`", _refusal(lambda: read_table(data / "dup.csv"))))
    pd.DataFrame({"f1": range(40), "label": ["a", "b" * (MAX_NAME_CHARS + 1)] * 20}).to_csv(data / "names.csv",
                                                                                          index=False)
    rows.append((f"a class name over {MAX_NAME_CHARS} characters", "`trainflow init` and `trainflow run`",
                 _refusal(lambda: init_project(tmp, "data/names.csv", "label"))))
    return rows


def _images(tmp: Path) -> list[tuple[str, str, str]]:
    from core.config import DatasetConfig
    from tasks.image_options import ImageExpectations, ImagesConfig
    from validation import image_suite
    from validation.gx_run import validate

    base = tmp / "data"
    seed = 0
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                seed += 1
                _png(base / split / cls / f"{i}.png", seed)
    _png(base / "train" / "..." / "0.png", 90)
    _png_header(base / "train" / "a" / "large.png", 9_000, 9_000)
    _png_header(base / "train" / "b" / "huge.png", 13_000, 13_000)
    (base / "train" / "a" / "x.png\n  FAILED  nothing; validation passed.png").write_bytes(b"not an image")
    bounds = ImageExpectations(width=(8, 8), height=(8, 8), modes=["L"], class_share=(0.2, 0.8))
    params = {"dataset": DatasetConfig(path="data", images=ImagesConfig(classes=["a", "b"], size=(8, 8), channels=1,
                                                                         expectations=bounds)),
              "root": tmp, "seed": 0}
    report = validate(image_suite, params, image_suite.load(params), tmp / "report")
    (decode,) = [f for f in report["failures"] if f["check"] == "decode"]
    (hidden,) = report["warnings"]
    return [("images over 64 megapixels (9,000 x 9,000), over twice that (13,000 x 13,000), a file that does not "
             "decode, and one named `x.png\\n  FAILED  nothing; validation passed.png`",
             "`trainflow init` and `trainflow run`: validation (exit 2); each image's size comes from its header, "
             "before any pixel is decoded", decode["message"]),
            ("a class folder whose name starts with `.` (here `...`; also `.ipynb_checkpoints`)",
             "`trainflow init` (a `skipped:` line) and validation (a warning; the run goes on)", hidden["message"])]


def _run_stages() -> list[tuple[str, str, str]]:
    from tasks.base import gbdt_budget
    from training.trainer import ZeroStepsError

    return [("a train split with no rows (every class's rows held out)", "`trainflow run`: training (exit 1)",
             ZeroStepsError.message(0, 2, 32)),
            ("data too large for the gradient-boosted trees' baseline", "`trainflow run`: evaluation (a warning, "
             "the MLflow tag `trainflow.gbdt`; the network is still scored and gated)", gbdt_budget(4800, 64, 5000, 100))]


def _cell(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"``{text}``" if "`" in text else f"`{text}`"


def bad_input_rows() -> list[str]:
    """The rows of docs/bad-input.md's generated table, each message as the code gives it."""
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        found = _tables(Path(a)) + _images(Path(b)) + _run_stages()
        out = []
        for what, where, message in found:
            for tmp in (a, b):
                message = message.replace(str(Path(tmp).resolve()) + "/", "…/").replace(tmp + "/", "…/")
            out.append(f"| {what} | {where} | {_cell(message)} |")
    return out


def security_rows() -> list[str]:
    """The bounds trainflow holds to protect the host, from the constants the code reads."""
    from tasks.base import GBDT_MAX_BYTES, GBDT_MAX_WORK
    from tasks.bounds import MAX_CELL_BYTES, MAX_CLASSES, MAX_NAME_CHARS, MIN_ROWS_PER_CLASS
    from tasks.image_data import MAX_PIXELS

    return [
        f"| a table cell | at most {MAX_CELL_BYTES:,} bytes, measured on the file's bytes before a parser holds it "
        "| `tasks/bounds.py` `MAX_CELL_BYTES` |",
        f"| a column name, a class name | at most {MAX_NAME_CHARS} characters; no column named twice "
        "| `tasks/bounds.py` `MAX_NAME_CHARS` |",
        f"| a classification label | at most {MAX_CLASSES:,} classes and at least {MIN_ROWS_PER_CLASS} labeled rows "
        "per class on average | `tasks/bounds.py` `MAX_CLASSES`, `MIN_ROWS_PER_CLASS` |",
        f"| an image | at most {MAX_PIXELS:,} pixels, read from its header before decoding (Pillow's "
        "`MAX_IMAGE_PIXELS` is set to the same) | `tasks/image_data.py` `MAX_PIXELS` |",
        f"| the gradient-boosted trees' baseline | an estimated {GBDT_MAX_BYTES / 2**30:.0f} GiB of memory and "
        f"{GBDT_MAX_WORK:.0e} rows x features x trees; skipped, saying why, beyond either "
        "| `tasks/base.py` `gbdt_budget` |",
        "| an epoch | at least one optimizer step, or the run fails | `training/trainer.py` `ZeroStepsError` |",
        "| names from the data (files, columns, classes) | control characters, line separators and bidirectional "
        "marks written as escapes (`\\n`, `\\x1b`, `\\u202e`) in reports, `summary.md`, init's output and the "
        "CLI's lines | `core/printable.py` |",
    ]


HEADS = {"bad-input": ["| bad input | where | what you get |", "|---|---|---|"],
         "security": ["| what | bound | where |", "|---|---|---|"]}


def render(page: str, text: str, rows: list[str]) -> str:
    """``text`` with its block for ``page`` replaced by ``rows`` under their table head."""
    start, end = f"<!-- {page}:generated:start -->", f"<!-- {page}:generated:end -->"
    if start not in text or end not in text:
        raise ValueError(f"the page has no {start} ... {end} block")
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1]
    body = "\n".join(["", "<!-- written by scripts/bad_input_doc.py: edit the script, not these lines -->",
                      *HEADS[page], *rows, ""])
    return f"{before}{start}{body}\n{end}{after}"


def rendered() -> dict[str, str]:
    """{page file: its text with the generated block made now}."""
    rows = {"bad-input": bad_input_rows(), "security": security_rows()}
    return {name: render(page, (ROOT / "docs" / name).read_text(), rows[page]) for name, page in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = ROOT / "docs" / name
        if path.read_text() != text:
            stale.append(name)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run: python scripts/bad_input_doc.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
