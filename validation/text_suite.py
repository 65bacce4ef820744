"""The text suite the GX runner (``validation.gx_run``) runs: a JSON Lines corpus (the ``lm`` task's
``dataset.text``, one ``{"path", "text"}`` document per line), the same report shape as tables.

GX runs on derived frames with one row per document, a handful of expectations whatever the size:

* ``<split>`` (``train``: ``text.train_file``, ``eval``: ``text.eval_file``), columns ``COLUMNS``:
  the document count lies in ``expectations.{train,eval}_docs``; every line parses as a
  ``{"path": str, "text": str}`` object (``format``); every document is valid UTF-8 (``utf8``: the
  raw line decodes strictly and the text holds no lone surrogate); none is empty or whitespace
  only (``empty``); each one's UTF-8 size lies in ``expectations.doc_bytes`` (``length``); no path
  repeats within the split (``duplicate``).
* ``cross_path`` / ``cross_content``: each split's distinct paths / content hashes; a value seen
  twice is a document in both splits (``leak``).

Failures carry the document's 0-based position in its split (``rows``) and examples
``{line, path, <value>}``; ``line`` is the 1-based line in the file.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import DataUnavailableError
from validation.gx_run import complete, cross_frame, leak_failure, name_rows, validate
from validation.report import span

if TYPE_CHECKING:
    import pandas as pd

    from core.config import DatasetConfig

NAME, NOUN = "text", "documents"
SPLITS = ("train", "eval")
COLUMNS = ["doc", "line", "path", "parsed", "utf8", "nonblank", "n_bytes", "sha256"]
CHECK_ORDER = ("row_count", "format", "utf8", "empty", "length", "duplicate", "leak", "other")


def document_frame(lines: list[bytes], record: tuple[str, ...] | None = None, name: str = "") -> pd.DataFrame:
    """One row per non-blank JSON line: what the expectations look at (see ``COLUMNS``). ``record``: the
    string keys a line holds instead of ``path`` and ``text`` (the causal_lm task's ``text``, or prompt
    and completion, joined as its text); its path is then ``<name>:<line>``."""
    import pandas as pd

    rows = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            decoded, utf8 = raw.decode("utf-8"), True
        except UnicodeDecodeError:
            decoded, utf8 = raw.decode("utf-8", "surrogateescape"), False
        path = text = None
        try:
            obj = json.loads(decoded)
            if record and isinstance(obj, dict) and all(isinstance(obj.get(k), str) for k in record):
                path, text = f"{name}:{number}", "".join(obj[k] for k in record)
            elif isinstance(obj, dict) and isinstance(obj.get("path"), str) and isinstance(obj.get("text"), str):
                path, text = obj["path"], obj["text"]
        except ValueError:
            pass
        if text is None:
            # Only the format check fails: size and content are unknown (nulls, skipped by GX).
            rows.append(dict(line=number, path=path, parsed=False, utf8=utf8, nonblank=True,
                             n_bytes=None, sha256=None))
            continue
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: raw bytes that were not UTF-8, or \ud800 escapes
            data, utf8 = text.encode("utf-8", "surrogateescape" if not utf8 else "surrogatepass"), False
        rows.append(dict(line=number, path=path, parsed=True, utf8=utf8, nonblank=bool(text.strip()),
                         n_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    df = pd.DataFrame(rows, columns=COLUMNS[1:])
    df.insert(0, "doc", range(len(df)))
    return df.astype({"doc": "int64", "line": "int64", "n_bytes": "Int64", "parsed": "bool",
                      "utf8": "bool", "nonblank": "bool"})


def load_splits(cfg: DatasetConfig, root: Path, record: tuple[str, ...] | None = None) -> dict[str, pd.DataFrame]:
    """``{"train": frame, "eval": frame}`` of the corpus files (``record``: see ``document_frame``).
    Raises DataUnavailableError."""
    frames = {}
    for split in SPLITS:
        path = Path(root) / cfg.path / getattr(cfg.text, f"{split}_file")
        if not path.is_file():
            raise DataUnavailableError(
                f"{split} split not found: {path} does not exist. The DVC-tracked data "
                f"({cfg.dvc_file}) is missing from the workspace; run `dvc pull` in {Path(root)}."
            )
        try:
            frames[split] = document_frame(path.read_bytes().splitlines(), record, path.name)
        except OSError as exc:
            raise DataUnavailableError(f"{split} split {path} cannot be read: {exc.strerror}") from None
    return frames


def plan(params: dict, frames: dict[str, pd.DataFrame]) -> list[dict]:
    import great_expectations.expectations as gxe

    exp = params["dataset"].text.expectations
    lo, hi = exp.doc_bytes
    out = []
    for split in SPLITS:
        rlo, rhi = getattr(exp, f"{split}_docs")
        out.append(dict(name=split, split=split, frame=frames[split], checks=[
            ("row_count", gxe.ExpectTableRowCountToBeBetween(min_value=rlo, max_value=rhi)),
            ("format", gxe.ExpectColumnValuesToBeInSet(column="parsed", value_set=[True])),
            ("utf8", gxe.ExpectColumnValuesToBeInSet(column="utf8", value_set=[True])),
            ("empty", gxe.ExpectColumnValuesToBeInSet(column="nonblank", value_set=[True])),
            ("length", gxe.ExpectColumnValuesToBeBetween(column="n_bytes", min_value=lo, max_value=hi)),
            ("duplicate", gxe.ExpectColumnValuesToBeUnique(column="path")),
        ], result_format=complete("doc", "line", "path", "n_bytes")))
    for column in ("path", "sha256"):
        out.append(dict(name=f"cross_{column}", split="cross", frame=cross_frame(frames, SPLITS, column, "doc", "path"),
                        checks=[("leak", gxe.ExpectColumnValuesToBeUnique(column=column))],
                        result_format=complete(*dict.fromkeys((column, "split", "doc", "path")))))
    return out


def failure(check: str, out: dict, kwargs: dict, result: dict, records: list[dict]) -> None:
    """Complete a failed check's report entry (see ``validation.report``)."""
    if check == "leak":
        what = "path" if out["column"] == "path" else "content"
        return leak_failure(out, records, out["column"], SPLITS, ("path", "doc"),
                            f"document(s) with the same {what} in train and eval")
    sized = check == "length"  # the size beside each document
    what = {
        "format": "line(s) not a JSON object with string 'path' and 'text'",
        "utf8": "document(s) not valid UTF-8",
        "empty": "empty or whitespace-only document(s)",
        "duplicate": "document(s) repeating a path",
        "length": f"document(s) with a UTF-8 size outside {span(kwargs)} bytes",
    }.get(check)
    name_rows(out, records, what, row="doc",
              example=lambda r: {"line": r.get("line"), "path": r.get("path"),
                                 **({"n_bytes": r.get("n_bytes")} if sized else {})},
              text=lambda r: f"{r.get('path') or '?'} (" + (f"{r.get('n_bytes')} B, " if sized else "")
              + f"line {r.get('line')})")


def message_column(f: dict):
    return f["column"]


# --------------------------------------------------------------------------- the suite protocol (gx_run)
# A text plan's params (``tasks.lm``): dataset (its ``text`` section), root.


def identity(params: dict) -> dict:
    """What makes this suite's result: the corpus section (files, windows, bounds)."""
    text = params["dataset"].text
    return {"text": text.model_dump(mode="json") if text is not None else None,
            **({"record": list(params["record"])} if params.get("record") else {})}


def run(params: dict, report_dir: Path) -> dict:
    """``gx_run.validate`` on the corpus files: the report, its files into ``report_dir``. Never raises on bad data."""
    frames = load_splits(params["dataset"], params["root"], params.get("record"))
    return validate(sys.modules[__name__], params, frames, Path(report_dir))
