"""The suite the GX runner (``validation.gx_run``) runs for text a pretrained model fine-tunes on
(``text_classification``: a table's text column and label; ``causal_lm``: JSON Lines of ``text``, or
``prompt`` + ``completion``), against the reviewed ``core.text_expectations`` file.

GX runs on derived frames with one row per record, a handful of expectations whatever the size:

* ``train`` / ``test`` (one ``file``: all of it is ``train``), per text column ``c``: the record
  parses with a string ``c`` (``format``, JSON Lines), ``c`` is not empty or whitespace only
  (``empty``), its length in characters and in the model's tokens lies in the reviewed bounds
  (``chars`` / ``tokens``); the label is one of the reviewed classes (``label``); the row count
  lies in ``rows``.
* ``cross``: each split's distinct text hashes; one seen twice is a text in both splits (``leak``),
  when the expectations ask for ``no_leak``.

Every failure names its rows: ``row`` is the 0-based record in its file (a CSV's data row, a
JSON Lines' record), ``line`` the 1-based line of the file.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import DataUnavailableError
from tasks.base import label_key
from validation.gx_run import complete, cross_frame, leak_failure, name_rows, validate
from validation.report import span

if TYPE_CHECKING:
    import pandas as pd

NAME, NOUN = "pretrained_text", "records"
SPLITS = ("train", "test")
CHECK_ORDER = ("row_count", "format", "empty", "chars", "tokens", "label", "leak", "other")


def _records(path: Path, fmt: str, columns: list[str], label: str | None) -> list[dict]:
    """``[{row, line, parsed, <column>: str | None, label}]`` of one file; DataUnavailableError when it
    cannot be read at all (a record that does not parse is a ``format`` failure, not an error)."""
    if not path.is_file():
        raise DataUnavailableError.not_pulled(path)
    out = []
    if fmt == "jsonl":
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise DataUnavailableError(f"{path} cannot be read: {exc.strerror}") from None
        row = 0
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            ok = isinstance(obj, dict) and all(isinstance(obj.get(c), str) for c in columns)
            out.append({"row": row, "line": number, "parsed": ok,
                        **{c: obj.get(c) if ok else None for c in columns}, "label": None})
            row += 1
        return out
    from tasks.table import read_table

    frame = read_table(path)
    missing = [c for c in [*columns, *([label] if label else [])] if c not in frame.columns]
    if missing:
        raise DataUnavailableError(f"{path}: no column {missing[0]!r} (the expectations name it)")
    for i, values in enumerate(frame[[*columns, *([label] if label else [])]].itertuples(index=False)):
        texts = dict(zip(columns, values[:len(columns)]))
        out.append({"row": i, "line": i + 2, "parsed": True,  # line 1 of a CSV is its header
                    **{c: v if isinstance(v, str) else None for c, v in texts.items()},
                    "label": values[len(columns)] if label else None})
    return out


def record_frame(records: list[dict], columns: list[str], tokenizer) -> pd.DataFrame:
    """One row per record: ``row``, ``line``, ``parsed``, per text column ``<c>.nonblank``,
    ``<c>.chars``, ``<c>.tokens``; ``label`` (as text); ``sha256`` of the texts (the leak key)."""
    import pandas as pd

    from tasks.text_init import token_lengths

    df = pd.DataFrame({"row": [r["row"] for r in records], "line": [r["line"] for r in records],
                       "parsed": [r["parsed"] for r in records]}).astype({"row": "int64", "line": "int64",
                                                                           "parsed": "bool"})
    for c in columns:
        texts = [r[c] for r in records]
        present = [t for t in texts if t is not None]
        counts = iter(token_lengths(tokenizer, present) if present else [])
        df[f"{c}.nonblank"] = [t is not None and bool(t.strip()) for t in texts]
        df[f"{c}.chars"] = pd.array([len(t) if t is not None else None for t in texts], dtype="Int64")
        df[f"{c}.tokens"] = pd.array([next(counts) if t is not None else None for t in texts], dtype="Int64")
    df["label"] = [None if r["label"] is None or r["label"] != r["label"] else label_key(r["label"]) for r in records]
    df["sha256"] = [hashlib.sha256("\x1f".join(r[c] or "" for c in columns).encode("utf-8", "surrogatepass"))
                    .hexdigest() if r["parsed"] else None for r in records]
    return df


def load(params: dict) -> dict[str, pd.DataFrame]:
    """``{"train", "test"}`` record frames (an empty ``test`` for one ``file``)."""
    from tasks.hf_folder import load_tokenizer

    exp, dataset, root = params["expectations"], params["dataset"], Path(params["root"])
    tokenizer = load_tokenizer(root / params["model_path"])
    frames = {}
    for split, name in params["files"].items():
        records = [] if name is None else _records(root / dataset.path / name, exp.format, exp.columns, exp.label)
        frames[split] = record_frame(records, exp.columns, tokenizer)
    return frames


def plan(params: dict, frames: dict[str, pd.DataFrame]) -> list[dict]:
    import great_expectations.expectations as gxe

    exp = params["expectations"]
    out = []
    for split in SPLITS:
        checks = []
        if split in exp.rows:
            lo, hi = exp.rows[split]
            checks.append(("row_count", gxe.ExpectTableRowCountToBeBetween(min_value=lo, max_value=hi)))
        if exp.format == "jsonl":
            checks.append(("format", gxe.ExpectColumnValuesToBeInSet(column="parsed", value_set=[True])))
        for c in exp.columns:
            checks.append(("empty", gxe.ExpectColumnValuesToBeInSet(column=f"{c}.nonblank", value_set=[True])))
            for key in ("chars", "tokens"):
                if c in getattr(exp, key):
                    lo, hi = getattr(exp, key)[c]
                    checks.append((key, gxe.ExpectColumnValuesToBeBetween(column=f"{c}.{key}", min_value=lo,
                                                                          max_value=hi)))
        if exp.labels is not None:
            checks.append(("label", gxe.ExpectColumnValuesToBeInSet(column="label",
                                                                    value_set=[label_key(v) for v in exp.labels])))
        if not checks or frames[split].empty:
            continue
        out.append(dict(name=split, split=split, frame=frames[split], checks=checks,
                        result_format=complete("row", "line")))
    if exp.no_leak and not frames["test"].empty:
        frame = cross_frame(frames, SPLITS, "sha256", "row", "line")
        frame["path"] = frame["row"]
        out.append(dict(name="cross_text", split="cross", frame=frame,
                        checks=[("leak", gxe.ExpectColumnValuesToBeUnique(column="sha256"))],
                        result_format=complete("sha256", "split", "row", "path")))
    return out


def failure(check: str, out: dict, kwargs: dict, result: dict, records: list[dict]) -> None:
    """Complete a failed check's report entry (see ``validation.report``): the rows, named."""
    if check == "leak":
        return leak_failure(out, records, "sha256", SPLITS, ("path", "row"), "text(s) in both train and test",
                            name=lambda s, p: f"{s} row {p[s + '_row']}")
    column = str(out.get("column") or "").rsplit(".", 1)[0]
    what = {
        "format": "record(s) not a JSON object with the text column(s) as strings",
        "empty": f"record(s) with an empty or missing {column}",
        "label": f"record(s) whose label is not one of the reviewed classes {kwargs.get('value_set')}",
        "chars": f"record(s) whose {column} has a length outside {span(kwargs)} characters",
        "tokens": f"record(s) whose {column} has a length outside {span(kwargs)} tokens of the model's tokenizer",
    }.get(check, "record(s) failed")
    name_rows(out, records, what, row="row", example=lambda r: {"row": r.get("row"), "line": r.get("line")},
              text=lambda r: f"row {r.get('row')} (line {r.get('line')})")


def message_column(f: dict):
    column = f.get("column")
    return str(column).rsplit(".", 1)[0] if column else None


def identity(params: dict) -> dict:
    """What makes this suite's result: the expectations, the split files, the model folder."""
    ds = params["dataset"]
    return {"expectations": params["expectations"].model_dump(mode="json"), "path": ds.path,
            "files": params["files"], "model": params["model_path"], "model_md5": params.get("model_md5")}


def run(params: dict, report_dir: Path) -> dict:
    """``gx_run.validate`` on ``load(params)``: the report, its files into ``report_dir``. Never raises on bad data."""
    return validate(sys.modules[__name__], params, load(params), Path(report_dir))
