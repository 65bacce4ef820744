"""The image suite the GX runner (``validation.gx_run``) runs: an image folder (the
``image_classification`` task's ``dataset.images``), the same report shape as tables.

GX runs on derived frames with one row per file (``tasks.image_data.profile``), a handful of
expectations whatever the number of images:

* ``<split>`` (train, test): the image count lies in ``expectations.{train,test}_images``; every
  file decodes with Pillow (``decode``); its width and height lie in ``expectations.width`` /
  ``height`` (``size``), its mode in ``expectations.modes`` (``mode``), its byte size in
  ``expectations.file_bytes`` (``file_bytes``); its class is one of ``images.classes``
  (``label_set``); no path repeats (``duplicate``, a manifest's).
* ``<split>_classes``: one row per reviewed class (``label, count, fraction``); each share lies in
  ``expectations.class_share`` (``class_balance``; a class missing from a split has share 0).
* ``cross``: each split's distinct content hashes; a hash seen twice is a file in both train and
  test (``leak``), named by both paths.

Failures name the files: ``examples`` are ``{path, <value>}`` and ``rows`` their positions.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from validation.gx_run import complete, cross_frame, leak_failure, name_rows, validate
from validation.report import MAX_EXAMPLES, span

if TYPE_CHECKING:
    import pandas as pd

    from core.config import DatasetConfig

NAME, NOUN = "image", "images"
SPLITS = ("train", "test")
# Profile rows of a streamed shard set that GX validates at a time: the suite's memory, whatever the set's size.
BATCH_ROWS = 2048
CHECK_ORDER = ("hidden", "row_count", "decode", "size", "mode", "file_bytes", "label_set", "duplicate", "class_balance",
               "leak", "other")


def load_splits(cfg: DatasetConfig, root: Path, seed: int) -> dict[str, pd.DataFrame]:
    """``{"train": profile, "test": profile}``. Raises DataUnavailableError (missing data, bad manifest)."""
    from tasks.image_data import list_images, profile

    if cfg.images.shards is not None:  # tar shards, read as a stream; a sample is named <split>/<shard>:<member>
        from tasks.image_sharded import profile_shards

        return profile_shards(cfg, root)
    entries = list_images(cfg, root, seed)
    return {s: profile(Path(root) / cfg.path, entries[s]) for s in SPLITS}


def _class_frame(counts, n: int, classes: list[str]) -> pd.DataFrame:
    """One row per reviewed class from ``counts`` (class -> images) of a split of ``n`` images."""
    import pandas as pd

    n = max(n, 1)
    return pd.DataFrame({"label": list(classes), "count": [int(counts.get(c, 0)) for c in classes],
                         "fraction": [float(counts.get(c, 0)) / n for c in classes]})


def plan(params: dict, frames: dict[str, pd.DataFrame]) -> list[dict]:
    import great_expectations.expectations as gxe

    images = params["dataset"].images
    exp = images.expectations

    def between(column: str, bounds: tuple):
        return gxe.ExpectColumnValuesToBeBetween(column=column, min_value=bounds[0], max_value=bounds[1])

    out = []
    for split in SPLITS:
        rlo, rhi = getattr(exp, f"{split}_images")
        out.append(dict(name=split, split=split, frame=frames[split], checks=[
            ("row_count", gxe.ExpectTableRowCountToBeBetween(min_value=rlo, max_value=rhi)),
            ("decode", gxe.ExpectColumnValuesToBeInSet(column="decodes", value_set=[True])),
            ("size", between("width", exp.width)),
            ("size", between("height", exp.height)),
            ("mode", gxe.ExpectColumnValuesToBeInSet(column="mode", value_set=list(exp.modes))),
            ("file_bytes", between("n_bytes", exp.file_bytes)),
            ("label_set", gxe.ExpectColumnValuesToBeInSet(column="label", value_set=list(images.classes))),
            ("duplicate", gxe.ExpectColumnValuesToBeUnique(column="path")),
        ], result_format=complete("file", "path", "error", "width", "height", "mode", "n_bytes", "label")))
        classes = _class_frame(frames[split]["label"].value_counts(), len(frames[split]), images.classes)
        out.append(dict(name=f"{split}_classes", split=split, frame=classes,
                        checks=[("class_balance", between("fraction", exp.class_share))],
                        result_format=complete("label", "count", "fraction")))
    out.append(dict(name="cross", split="cross", frame=cross_frame(frames, SPLITS, "sha256", "path"),
                    checks=[("leak", gxe.ExpectColumnValuesToBeUnique(column="sha256"))],
                    result_format=complete("sha256", "split", "path")))
    return out


def failure(check: str, out: dict, kwargs: dict, result: dict, records: list[dict]) -> None:
    """Complete a failed check's report entry (see ``validation.report``)."""
    column, values = out["column"], kwargs.get("value_set")
    if check == "leak":
        out["column"] = None
        return leak_failure(out, records, "sha256", SPLITS, ("path",),
                            "image(s) with the same content in train and test")
    if check == "class_balance":
        shown = records[:MAX_EXAMPLES]
        out.update(examples=[{"class": r.get("label"), "count": r.get("count"), "fraction": r.get("fraction")}
                             for r in shown],
                   detail=f"{out['unexpected_count']} class(es) with a share outside {span(kwargs)}: "
                   + ", ".join(f"{r.get('label')} {float(r.get('fraction') or 0):.3f} ({r.get('count')} images)"
                               for r in shown))
        return
    # check -> (what failed, the file's value shown beside its path)
    what, value = {
        "decode": ("file(s) Pillow cannot decode", lambda r: r.get("error") or "does not decode"),
        "size": (f"image(s) with a {column} outside {span(kwargs)} pixels",
                 lambda r: f"{r.get('width')} x {r.get('height')}"),
        "mode": (f"image(s) with a mode not in {values}", lambda r: f"mode {r.get('mode')}"),
        "file_bytes": (f"file(s) with a size outside {span(kwargs)} bytes", lambda r: f"{r.get('n_bytes')} B"),
        "label_set": (f"image(s) of a class not in the reviewed classes {values}",
                      lambda r: f"class {r.get('label')!r}"),
        "duplicate": ("path(s) listed more than once", None),
    }.get(check, ("failed", None))
    name_rows(out, records, what, row="file",
              example=lambda r: {"path": r.get("path"), **({column: r.get(column)} if column else {})},
              text=lambda r: f"{r.get('path')}" + (f" ({value(r)})" if value else ""))


def warnings(params: dict) -> list[dict]:
    """A warning for each hidden folder or file the listing skipped (``tasks.image_data.hidden_paths``)."""
    from tasks.image_data import hidden_paths

    out = []
    if params.get("root") is None:
        return out
    for path in hidden_paths(params["dataset"], params["root"]):
        split = "test" if path.startswith(params["dataset"].images.test_dir.rstrip("/") + "/") else "train"
        detail = f"skipped {path}: hidden (its name starts with '.'); rename it to use it"
        out.append({"split": split, "check": "hidden", "expectation": None, "column": None,
                    "unexpected_count": None, "examples": [path], "rows": [], "detail": detail,
                    "message": f"{split}: {detail}", "severity": "warning"})
    return out


def message_column(f: dict):
    return f["column"] if f["check"] == "size" else None


# --------------------------------------------------------------------------- the suite protocol (gx_run)
# An image plan's params (``tasks.images``): dataset (its ``images`` section), root, seed.


def identity(params: dict) -> dict:
    """What makes this suite's result: the images section (layout, classes, bounds) and the seed
    (a manifest without a split column is split by it)."""
    images = params["dataset"].images
    return {"images": images.model_dump(mode="json") if images is not None else None, "seed": params.get("seed"),
            "test_fraction": params["dataset"].test_fraction}


def load(params: dict) -> dict[str, pd.DataFrame]:
    """The splits' profiles; ``tasks.bounds.DataRefusedError`` when there are more classes (the
    reviewed ones and those found) than the images can teach, before any check runs."""
    from tasks.bounds import check_classes

    frames = load_splits(params["dataset"], params["root"], params.get("seed", 0))
    found = set().union(*(set(f["label"]) for f in frames.values()))
    classes = found | set(params["dataset"].images.classes or [])
    check_classes(len(classes), sum(len(f) for f in frames.values()), "label", params["dataset"].path)
    return frames


def run(params: dict, report_dir: Path) -> dict:
    """Run the suite on ``params``' data and write the report files into ``report_dir``; the same report
    shape as the table suite. Never raises on bad data. A shard set is read as a stream (:func:`_streamed`);
    a folder or manifest (below the size ``init`` writes as shards) is profiled whole."""
    if params["dataset"].images.shards is not None:
        return _streamed(params, Path(report_dir))
    return validate(sys.modules[__name__], params, load(params), Path(report_dir))


class SplitTally:
    """What a streamed split's split-level checks need, from its profile batches: the image count and
    each class's count (bounded by the classes), and an 8-byte prefix of each image's content hash for
    the leak check (as the table suite keeps per row). Nothing else of a sample outlives its batch."""

    def __init__(self):
        from collections import Counter

        self.rows, self.classes, self.hashes = 0, Counter(), []

    def add(self, frame: pd.DataFrame) -> None:
        import numpy as np

        self.rows += len(frame)
        self.classes.update(frame["label"])
        self.hashes.append(np.array([int(h[:16], 16) for h in frame["sha256"]], dtype="uint64"))


def _streamed(params: dict, report_dir: Path) -> dict:
    """The suite on a shard set, one sample's bytes and ``BATCH_ROWS`` profile rows in memory at a time:
    GX validates each batch of a split's rows (``ItemBatches`` merges the results as on the whole split),
    the class shares and the row count come from :class:`SplitTally`, and the leak check looks up the
    content hashes, naming a leaked sample's shard and member only once it is found."""
    from itertools import islice

    import great_expectations.expectations as gxe
    import pandas as pd

    from tasks.bounds import check_classes
    from tasks.image_data import profile_frame, profile_row
    from tasks.image_shards import ShardIndex, iter_samples, split_shards
    from validation.gx_run import ItemBatches, derived_report, plan_items, run_item, start_run
    from validation.suite import _cross_from_hashes

    started, dataset = time.perf_counter(), params["dataset"]
    shards = split_shards(dataset, params["root"])
    items = plan_items(sys.modules[__name__], params, {s: profile_frame([]) for s in SPLITS})
    by_name, tally = {item.name: item for item in items}, {s: SplitTally() for s in SPLITS}
    gx_run = start_run(started)
    for s in SPLITS:
        batches, samples, rows = ItemBatches(gx_run, by_name[s]), enumerate(iter_samples(shards[s], s)), None
        while rows is None or len(rows) == BATCH_ROWS:  # a split with no image: one empty batch
            rows = [profile_row(i, name, label, data) for i, (name, data, label) in islice(samples, BATCH_ROWS)]
            frame = profile_frame(rows)
            tally[s].add(frame)
            batches.add(frame)
        batches.finish({i: pd.DataFrame(index=pd.RangeIndex(tally[s].rows))  # the row count on N rows, no columns
                        for i, e in enumerate(by_name[s].expectations)
                        if isinstance(e, gxe.ExpectTableRowCountToBeBetween)})
        by_name[f"{s}_classes"].frame = _class_frame(tally[s].classes, tally[s].rows, dataset.images.classes)
        run_item(gx_run, by_name[f"{s}_classes"])
    found = set().union(*(t.classes for t in tally.values())) | set(dataset.images.classes or [])
    check_classes(len(found), sum(t.rows for t in tally.values()), "label", dataset.path)
    leaked, total = _cross_from_hashes({s: tally[s].hashes for s in SPLITS})
    index, paths = {s: ShardIndex(shards[s]) for s in set(leaked["split"])}, []
    for s, at in zip(leaked["split"], leaked["row"]):
        unit, member = index[s].locate(int(at))
        paths.append(f"{s}/{shards[s][unit].name}:{member.name}")
    cross = by_name["cross"]
    cross.frame = pd.DataFrame({"sha256": leaked["row_hash"], "split": leaked["split"], "path": paths})
    leaks = ItemBatches(gx_run, cross)  # GX's counts as on the whole cross frame
    leaks.add(cross.frame, {0: {"element_count": total, "missing_count": 0}})
    leaks.finish()
    return derived_report(sys.modules[__name__], params, gx_run, items, {s: tally[s].rows for s in SPLITS}, report_dir)
