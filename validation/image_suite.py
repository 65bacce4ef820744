"""The image suite the GX runner (``validation.gx_run``) runs: an image folder (the
``image_classification`` task's ``dataset.images``), the same report shape as tables.

GX runs on derived frames with one row per file (``tasks.image_data.profile``), so a suite is a
handful of expectations whatever the number of images:

* ``<split>`` (train, test), columns ``file, path, label, n_bytes, sha256, decodes, error, width,
  height, mode``: the image count lies in ``expectations.{train,test}_images``; every file decodes
  with Pillow (``decode``); its width and height lie in ``expectations.width`` / ``height``
  (``size``), its mode in ``expectations.modes`` (``mode``), its byte size in
  ``expectations.file_bytes`` (``file_bytes``); its class is one of ``images.classes``
  (``label_set``); no path repeats (``duplicate``, a manifest's).
* ``<split>_classes``: one row per reviewed class (``label, count, fraction``); each share lies in
  ``expectations.class_share`` (``class_balance``; a class missing from a split has share 0).
* ``cross``: each split's distinct content hashes, concatenated; a hash seen twice is a file in
  both train and test (``leak``), named by both paths.

Failures name the files: ``examples`` are ``{path, <value>}`` and ``rows`` their positions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from validation.gx_run import (Item, Run, complete, derived_failure, plan_failures, plan_items, sort_failures,
                               validate)
from validation.report import MAX_EXAMPLES, fmt_bound, jsonable

if TYPE_CHECKING:
    import pandas as pd

    from core.config import DatasetConfig

NAME = "image"
SPLITS = ("train", "test")
_CHECK_ORDER = ("row_count", "decode", "size", "mode", "file_bytes", "label_set", "duplicate", "class_balance",
                "leak", "other")


def load_splits(cfg: DatasetConfig, root: Path, seed: int) -> dict[str, pd.DataFrame]:
    """``{"train": profile, "test": profile}``. Raises DataUnavailableError (missing data, bad manifest)."""
    from tasks.image_data import list_images, profile

    entries = list_images(cfg, root, seed)
    return {s: profile(Path(root) / cfg.path, entries[s]) for s in SPLITS}


def _class_frame(frame: pd.DataFrame, classes: list[str]) -> pd.DataFrame:
    import pandas as pd

    counts = frame["label"].value_counts()
    n = max(len(frame), 1)
    return pd.DataFrame({"label": list(classes), "count": [int(counts.get(c, 0)) for c in classes],
                         "fraction": [float(counts.get(c, 0)) / n for c in classes]})


def _cross_frame(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    import pandas as pd

    parts = []
    for split in SPLITS:
        df = frames[split]
        df = df[df["sha256"].notna()].drop_duplicates("sha256", keep="first")
        parts.append(pd.DataFrame({"sha256": df["sha256"].to_numpy(dtype=object), "split": split,
                                   "path": df["path"].to_numpy(dtype=object)}))
    return pd.concat(parts, ignore_index=True)


def _plan(cfg: DatasetConfig, frames: dict[str, pd.DataFrame]) -> list[dict]:
    import great_expectations.expectations as gxe

    images = cfg.images
    exp = images.expectations
    plan = []
    for split in SPLITS:
        rlo, rhi = exp.train_images if split == "train" else exp.test_images
        checks = [
            ("row_count", gxe.ExpectTableRowCountToBeBetween(min_value=rlo, max_value=rhi)),
            ("decode", gxe.ExpectColumnValuesToBeInSet(column="decodes", value_set=[True])),
            ("size", gxe.ExpectColumnValuesToBeBetween(column="width", min_value=exp.width[0], max_value=exp.width[1])),
            ("size", gxe.ExpectColumnValuesToBeBetween(column="height", min_value=exp.height[0],
                                                       max_value=exp.height[1])),
            ("mode", gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=list(exp.modes))),
            ("file_bytes", gxe.ExpectColumnValuesToBeBetween(column="n_bytes", min_value=exp.file_bytes[0],
                                                             max_value=exp.file_bytes[1])),
            ("label_set", gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(images.classes))),
            ("duplicate", gxe.ExpectColumnValuesToBeUnique(column="path")),
        ]
        plan.append(dict(name=split, split=split, frame=frames[split], checks=checks,
                         result_format=complete("file", "path", "error", "width", "height", "mode", "n_bytes",
                                                "label")))
        lo, hi = exp.class_share
        plan.append(dict(name=f"{split}_classes", split=split, frame=_class_frame(frames[split], images.classes),
                         checks=[("class_balance", gxe.ExpectColumnValuesToBeBetween(column="fraction", min_value=lo,
                                                                                      max_value=hi))],
                         result_format=complete("label", "count", "fraction")))
    plan.append(dict(name="cross", split="cross", frame=_cross_frame(frames),
                     checks=[("leak", gxe.ExpectColumnValuesToBeUnique(column="sha256"))],
                     result_format=complete("sha256", "split", "path")))
    return plan


def _where(records: list[dict], value=None) -> str:
    shown = records[:MAX_EXAMPLES]
    text = ", ".join(f"{r.get('path')}" + (f" ({value(r)})" if value else "") for r in shown)
    return text + (" ..." if len(records) > MAX_EXAMPLES else "")


def failure(split: str, check: str, evr: dict) -> dict:
    """One report entry (see ``validation.report``) from a failed expectation result."""
    out, kwargs, result, records, evaluated = derived_failure(split, check, evr)
    if not evaluated:
        return jsonable(out)
    column, count = out["column"], out["unexpected_count"]
    lo, hi = fmt_bound(kwargs.get("min_value")), fmt_bound(kwargs.get("max_value"))
    if check == "row_count":
        observed = result.get("observed_value")
        out.update(column=None, examples=[observed], detail=f"{observed} images, expected {lo}..{hi}")
        return jsonable(out)
    if check == "leak":
        by_hash: dict = {}
        for r in records:
            by_hash.setdefault(r.get("sha256"), {}).setdefault(r.get("split"), r.get("path"))
        pairs = [{"train_path": v.get("train"), "test_path": v.get("test")} for v in by_hash.values()]
        out.update(column=None, unexpected_count=len(pairs), examples=pairs[:MAX_EXAMPLES],
                   detail=f"{len(pairs)} image(s) with the same content in train and test: "
                   + ", ".join(f"train {p['train_path']} = test {p['test_path']}" for p in pairs[:MAX_EXAMPLES])
                   + (" ..." if len(pairs) > MAX_EXAMPLES else ""))
        return jsonable(out)
    if check == "class_balance":
        out.update(examples=[{"class": r.get("label"), "count": r.get("count"), "fraction": r.get("fraction")}
                             for r in records[:MAX_EXAMPLES]],
                   detail=f"{count} class(es) with a share outside [{lo}, {hi}]: "
                   + ", ".join(f"{r.get('label')} {float(r.get('fraction') or 0):.3f} ({r.get('count')} images)"
                               for r in records[:MAX_EXAMPLES]))
        return jsonable(out)
    out["rows"] = [r.get("file") for r in records[:MAX_EXAMPLES]]
    value = {"decode": lambda r: r.get("error") or "does not decode",
             "size": lambda r: f"{r.get('width')} x {r.get('height')}",
             "mode": lambda r: f"mode {r.get('mode')}",
             "file_bytes": lambda r: f"{r.get('n_bytes')} B",
             "label_set": lambda r: f"class {r.get('label')!r}",
             "duplicate": None}.get(check)
    out["examples"] = [{"path": r.get("path"), **({column: r.get(column)} if column else {})}
                       for r in records[:MAX_EXAMPLES]]
    what = {
        "decode": "file(s) Pillow cannot decode",
        "size": f"image(s) with a {column} outside [{lo}, {hi}] pixels",
        "mode": f"image(s) with a mode not in {kwargs.get('value_set')}",
        "file_bytes": f"file(s) with a size outside [{lo}, {hi}] bytes",
        "label_set": f"image(s) of a class not in the reviewed classes {kwargs.get('value_set')}",
        "duplicate": "path(s) listed more than once",
    }.get(check, "failed")
    out["detail"] = f"{count} {what}: {_where(records, value)}"
    return jsonable(out)


# --------------------------------------------------------------------------- the suite protocol (gx_run)
# An image plan's params (``tasks.images``): dataset (its ``images`` section), root, seed.


def identity(params: dict) -> dict:
    """What makes this suite's result: the images section (layout, classes, bounds) and the seed
    (a manifest without a split column is split by it)."""
    images = params["dataset"].images
    return {"images": images.model_dump(mode="json") if images is not None else None, "seed": params.get("seed"),
            "test_fraction": params["dataset"].test_fraction}


def load(params: dict) -> dict[str, pd.DataFrame]:
    return load_splits(params["dataset"], params["root"], params.get("seed", 0))


def items(params: dict, splits: dict[str, pd.DataFrame]) -> tuple[list[Item], list[dict]]:
    return plan_items(_plan(params["dataset"], splits), "image"), []


def failures(params: dict, run: Run, items: list[Item]) -> list[dict]:
    return sort_failures(plan_failures(run, items, failure, lambda f: f["column"] if f["check"] == "size" else None),
                         SPLITS, _CHECK_ORDER)


def validate_images(cfg: DatasetConfig, splits: dict[str, pd.DataFrame], report_dir: Path) -> dict:
    """Run the image suite on ``splits`` (from :func:`load_splits`) and write the report files
    into ``report_dir``. Never raises on bad data."""
    return validate(sys.modules[__name__], {"dataset": cfg}, splits, Path(report_dir))
