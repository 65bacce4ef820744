"""The one Great Expectations runner: a task's validation plan in, the report and its files out.

A task's plan (``tasks.base.ValidationPlan``, torch-free data) names a suite, the files it reads
and the suite's parameters. :func:`run_plan` loads the splits, asks the suite for its derived
frames and expectations (:class:`Item` s), validates them in one ephemeral GX context
(:func:`run_items`), asks the suite to read the failures, and writes ``gx_result.json``,
``summary.md`` and the Data Docs (:func:`write_report`). :func:`data_key` and :func:`suite_key`
key the result cache (``validation.cache``).

A suite is a module with ``NAME``, ``SPLITS``, ``identity(params)`` and either ``run(params,
report_dir)`` (it reads its data itself: ``validation.suite``, a table against its reviewed
expectations file, in Arrow batches) or ``load(params)``, ``items(params, frames)`` and
``failures(params, run, items)`` (``validation.text_suite``, a JSON Lines corpus). The suites
import this runner; it imports them only by name when a plan asks (:data:`SUITES`), so there is
no import cycle. GX is imported inside the functions; the caller sets ``GX_ANALYTICS_ENABLED=false``.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from validation.report import jsonable, summary_markdown

log = logging.getLogger(__name__)

# GX's ephemeral context already has a site called "local_site": ours needs another name.
DATA_DOCS_SITE = "trainflow_data_docs"
RESULT_JSON = "gx_result.json"
SUMMARY_MD = "summary.md"
DATA_DOCS_DIR = "data_docs"


# The suites a plan may name (``ValidationPlan.runner``) -> their module, imported when asked.
SUITES = {"table": "validation.suite", "text": "validation.text_suite", "image": "validation.image_suite"}


def suite_module(name: str):
    """The suite module a plan names; ValueError naming an unknown one."""
    from importlib import import_module

    if name not in SUITES:
        raise ValueError(f"validation plan: unknown suite {name!r}; known: {', '.join(SUITES)}")
    return import_module(SUITES[name])


def run_plan(plan, report_dir: Path) -> dict:
    """Validate what ``plan`` names and write the report files into ``report_dir``; the report
    (see :func:`write_report`). Never raises on bad data; DataUnavailableError for a missing file."""
    suite = suite_module(plan.runner)
    if hasattr(suite, "run"):  # it reads its data itself (in batches, however large)
        return suite.run(plan.params, Path(report_dir))
    return validate(suite, plan.params, suite.load(plan.params), Path(report_dir))


def data_key(plan) -> str:
    """sha256 over the bytes of the files the plan reads (DataUnavailableError names a missing one)."""
    return data_hash(plan.files)


def suite_key(plan) -> str:
    """Identity of the suite the plan runs with its parameters (:func:`suite_identity`)."""
    suite = suite_module(plan.runner)
    return suite_identity(suite, suite.identity(plan.params))


def data_hash(paths: list[Path]) -> str:
    """sha256 over the bytes of ``paths`` (what is in the workspace, not what the ``.dvc`` file
    claims: an edit nobody ``dvc add``-ed is never taken for validated); a folder of Parquet files
    by each file's name and bytes.
    Raises DataUnavailableError naming a missing file."""
    from core.errors import DataUnavailableError
    from core.hashing import file_sha256, sha256_json

    digests = []
    for path in map(Path, paths):
        if path.is_dir():  # a folder of Parquet files: each file, in reading order
            from tasks.columnar import parquet_files

            digests.append([path.name, [[f.name, file_sha256(f)] for f in parquet_files(path)]])
            continue
        if not path.is_file():
            raise DataUnavailableError(f"{path} does not exist. The DVC-tracked data is missing from the "
                                       "workspace; run `dvc pull` (or check dataset.path)")
        digests.append([path.name, file_sha256(path)])
    return sha256_json(digests)


def suite_identity(suite, parts: dict) -> str:
    """sha256 of a suite's ``parts``, its module's code, this runner's, ``validation.report``'s and
    ``tasks.columnar``'s, and the installed GX version, without importing GX: a change to any of
    them is a new suite."""
    from importlib.metadata import PackageNotFoundError, version

    from core.hashing import file_sha256, sha256_json

    here = Path(__file__).resolve().parent
    # tasks/columnar.py reads the table suite's batches and counts their values.
    code = [Path(suite.__file__), here / "gx_run.py", here / "report.py", here.parent / "tasks" / "columnar.py"]
    try:
        gx_version = version("great_expectations")
    except PackageNotFoundError:
        gx_version = "missing"
    return sha256_json({**parts, "code": [file_sha256(f) for f in code], "gx": gx_version})


def validate(suite, params: dict, splits: dict, report_dir: Path) -> dict:
    """Run ``suite`` with ``params`` on ``splits`` (``{split: frame}``, every one of ``suite.SPLITS``)
    and write the report files into ``report_dir``. ValueError when a split is missing or the
    suite finds its parameters contradict each other; never raises on bad data."""
    started = time.perf_counter()
    missing = [s for s in suite.SPLITS if s not in splits]
    if missing:
        raise ValueError(f"the {suite.NAME} suite needs splits {list(suite.SPLITS)}; missing {missing}")
    items, skipped = suite.items(params, splits)
    run = run_items(items, started)
    return write_report(run, items, report_dir, failures=suite.failures(params, run, items),
                        rows={s: int(len(splits[s])) for s in suite.SPLITS}, skipped=skipped)


def plan_items(plan: list[dict], kind: str) -> list["Item"]:
    """The items of a derived-frame suite's plan (``[{name, split, frame, checks: [(check,
    expectation)], result_format}]``), each expectation named by its check."""
    return [Item(p["name"], p["split"], kind, p["frame"], [e for _, e in p["checks"]], p["result_format"],
                 checks=[c for c, _ in p["checks"]]) for p in plan]


def plan_failures(run: "Run", items: list["Item"], failure, message_column) -> list[dict]:
    """Every failed expectation of ``items`` as ``failure(split, check, evr)`` gives it, with its
    one-line ``message`` (``validation.report.where`` of its split and ``message_column(f)``, then
    the detail). GX returns results in its own order: they are matched to checks by expectation
    type and column."""
    from validation.report import where

    out = []
    for item in items:
        checks = {(e.expectation_type, getattr(e, "column", None)): c for c, e in zip(item.checks, item.expectations)}
        for evr in run.raw[item.name].get("results", []):
            if evr.get("success"):
                continue
            cfg_ = evr.get("expectation_config") or {}
            key = (cfg_.get("type"), (cfg_.get("kwargs") or {}).get("column"))
            f = failure(item.split, checks.get(key, "other"), evr)
            f["message"] = f"{where(f['split'], message_column(f))}: {f['detail']}"
            out.append(f)
    return out


def sort_failures(failures: list[dict], splits: tuple[str, ...], checks: tuple[str, ...]) -> list[dict]:
    """Failures by split (in ``splits`` order, then cross), then by check (in ``checks`` order)."""
    order = (*splits, "cross")
    return sorted(failures, key=lambda f: (order.index(f["split"]) if f["split"] in order else 9,
                                           checks.index(f["check"]) if f["check"] in checks else 9))


def derived_failure(split: str, check: str, evr: dict) -> tuple[dict, dict, dict, list[dict], bool]:
    """The start of a derived-frame suite's report entry (see ``validation.report``) for a failed
    expectation result: ``(entry, kwargs, result, records, evaluated)``, ``records`` the unexpected
    rows as dicts of the index columns; not ``evaluated``: GX could not evaluate it (a missing
    column, a wrong type) and the entry's detail says why."""
    from validation.report import index_records

    config = evr.get("expectation_config") or {}
    kwargs = config.get("kwargs") or {}
    result = evr.get("result") or {}
    count = result.get("unexpected_count")
    out = {"split": split, "check": check, "expectation": config.get("type", "unknown"), "column": kwargs.get("column"),
           "unexpected_count": int(count) if count is not None else None, "examples": [], "rows": [],
           "detail": "failed"}
    info = evr.get("exception_info") or {}
    errors = [v.get("exception_message") for v in info.values() if isinstance(v, dict) and v.get("raised_exception")]
    if info.get("raised_exception") or errors:
        error = info.get("exception_message") or errors[0]
        out.update(unexpected_count=None, detail=f"could not be evaluated: {error}")
        return out, kwargs, result, [], False
    return out, kwargs, result, [r for r in index_records(result) if isinstance(r, dict)], True


def complete(*index_columns: str) -> dict:
    """Every unexpected row of a derived frame, as ``index_columns`` (the domain column included).

    COMPLETE, so a stacked frame yields every (column, row) pair and exact per-column counts.
    ``exclude_unexpected_values`` makes GX return one dict of lists instead of a dict per row;
    with a named index holding ``index_columns`` GX reads them from the index tuple instead of
    one ``.at`` lookup per cell (the slow part when many cells fail).
    """
    return {
        "result_format": "COMPLETE",
        "unexpected_index_column_names": list(index_columns),
        "exclude_unexpected_values": True,
        "return_unexpected_index_query": False,
    }


SUMMARY = {"result_format": "SUMMARY", "partial_unexpected_count": 5, "return_unexpected_index_query": False}


@dataclass
class Item:
    """One derived frame to validate: GX data asset, suite and validation definition ``trainflow_<name>``.

    ``split``/``kind`` tell the report where its results came from; ``covers[i]`` is how many
    checks expectation ``i`` stands for (a stacked expectation: one per column it covers);
    ``checks[i]`` the report's check name for expectation ``i`` where the suite names them.
    """

    name: str
    split: str
    kind: str
    frame: Any
    expectations: list
    result_format: dict
    covers: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.covers:
            self.covers = [1] * len(self.expectations)


@dataclass
class Run:
    context: Any
    run_id: Any
    raw: dict[str, dict]          # item name -> GX suite result (JSON form)
    started: float

    def results(self, items: list[Item]) -> list[tuple[Item, dict]]:
        """Every expectation result with the item it came from, in plan order."""
        return [(item, evr) for item in items for evr in self.raw[item.name].get("results", [])]


def run_items(items: list[Item], started: float | None = None) -> Run:
    """Validate every item in one ephemeral GX context. Never raises on data GX chokes on:
    such an item's expectations all fail with the exception's message (and a warning is logged)."""
    run = start_run(started)
    for item in items:
        run_item(run, item)
    return run


def start_run(started: float | None = None) -> Run:
    """An ephemeral GX context with the pandas data source items are validated in (progress bars off)."""
    started = time.perf_counter() if started is None else started
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.data_sources.add_pandas(name="trainflow")
    return Run(context=context, run_id=gx.RunIdentifier(run_name="trainflow-validate"), raw={}, started=started)


def _definition(run: Run, item: Item):
    """The item's GX data asset, suite and validation definition, added to the run's context."""
    import great_expectations as gx

    datasource = run.context.data_sources.get("trainflow")
    batch = datasource.add_dataframe_asset(name=item.name).add_batch_definition_whole_dataframe(
        name=f"{item.name}_whole")
    suite = run.context.suites.add(gx.ExpectationSuite(name=f"trainflow_{item.name}", expectations=item.expectations))
    return run.context.validation_definitions.add(
        gx.ValidationDefinition(name=f"trainflow_{item.name}", data=batch, suite=suite))


def run_item(run: Run, item: Item) -> None:
    """Validate ``item.frame`` whole (GX stores the result for the Data Docs); into ``run.raw``."""
    definition = _definition(run, item)
    try:
        run.raw[item.name] = definition.run(batch_parameters={"dataframe": item.frame},
                                            result_format=item.result_format, run_id=run.run_id).to_json_dict()
    except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
        log.warning("GX could not validate %s: %s: %s", item.name, type(exc).__name__, exc)
        run.raw[item.name] = errored_result(item.expectations, exc)


class ItemBatches:
    """``item``'s suite validated batch by batch (:meth:`add`), kept as ONE result (:meth:`finish`),
    as if GX had validated the whole table: what :func:`run_item` gives, in bounded memory (one
    batch: its result, recounted).

    The batches are consecutive parts of one table, each frame's index the rows' positions in the
    whole table. Per expectation the batches' counts are added (element, missing, unexpected), the
    percents and success computed again from the sums (``mostly`` honoured), the example lists
    joined (partial lists cut at the result format's length; complete index lists at ``keep``
    entries, ``unexpected_count`` staying exact). ``group_by``: an index column (a stacked frame's
    ``cell_column``) whose every value keeps up to ``keep`` entries and its exact count, in
    ``result[BY_GROUP]``. Table-level results (a column list) are replaced by :meth:`finish`'s
    ``whole``. Only the merged result is stored: one Data Docs page per item, as run_item.
    """

    def __init__(self, run: Run, item: Item, keep: int = 1000, group_by: str | None = None):
        self.run, self.item, self.keep, self.group_by = run, item, keep, group_by
        self.definition = _definition(run, item)
        self.merged = None
        self.batch_id = None
        self.batches = 0
        self.error: Exception | None = None

    def _validate(self, frame):
        from great_expectations.validator.v1_validator import Validator

        if self.batch_id is None:
            # The first batch as run_item validates it (data read whole is one batch), its result
            # stored under the key finish's merged one replaces; the rest with GX's Validator
            # alone: no result stored only to be replaced, no freshness check of the suite again.
            result = self.definition.run(batch_parameters={"dataframe": frame},
                                         result_format=self.item.result_format, run_id=self.run.run_id)
            self.batch_id = self.definition.batch_definition.get_batch(batch_parameters={"dataframe": frame}).id
            return result
        validator = Validator(batch_definition=self.definition.batch_definition,
                              batch_parameters={"dataframe": frame}, result_format=self.item.result_format)
        return validator.validate_expectation_suite(self.definition.suite)

    def add(self, frame, counts: dict[int, dict] | None = None) -> None:
        """Validate one batch and fold its result in (a batch GX chokes on fails the item).
        ``counts``: ``{expectation index: {result key: value}}`` that replace GX's counts for this
        batch, where ``frame`` holds only the rows that can fail (their element and missing counts
        are the batch's, which the caller knows)."""
        if self.error is not None:
            return
        try:
            part = self._validate(frame)
            self.batches += 1
            if counts:
                keys = {_key(self.definition.suite.expectations[i].configuration): c for i, c in counts.items()}
                for evr in part.results:
                    if _key(evr.expectation_config) in keys and evr.result is not None:
                        evr.result.update(keys[_key(evr.expectation_config)])
            if self.group_by:
                for evr in part.results:
                    _count_groups(evr.result, self.group_by, self.keep)
            self.merged = part if self.merged is None else _merge_suite_results(
                self.merged, part, self.item.result_format, self.keep, self.group_by)
        except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
            self.error = exc

    def finish(self, whole: dict | None = None) -> None:
        """Store the merged result into ``run.raw``. ``whole``: ``{expectation index: frame}`` for
        the expectations that need the whole table (a row count), each validated by GX on its own
        frame (one with the table's N rows and no columns costs no memory) instead of per batch."""
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        run, item = self.run, self.item
        try:
            if self.error is not None:
                raise self.error
            if self.merged is None:
                raise ValueError(f"{item.name}: no batch was validated")
            merged = self.merged
            for i, frame in (whole or {}).items():
                key = _key(self.definition.suite.expectations[i].configuration)
                own = {_key(r.expectation_config): r for r in self._validate(frame).results}
                merged.results = [own[key] if _key(r.expectation_config) == key else r for r in merged.results]
            _restate(merged)
            if self.batches > 1:  # GX's own placeholder says one data frame
                merged.meta.update(batch_parameters={"dataframe": "<batches>"})
            suite_id = ExpectationSuiteIdentifier(name=self.definition.suite.name)
            run.context.validation_results_store.store_validation_results(
                suite_validation_result=merged,
                suite_validation_result_identifier=ValidationResultIdentifier(
                    batch_identifier=self.batch_id, expectation_suite_identifier=suite_id, run_id=run.run_id),
                expectation_suite_identifier=suite_id)
            run.raw[item.name] = merged.to_json_dict()
        except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
            log.warning("GX could not validate %s: %s: %s", item.name, type(exc).__name__, exc)
            run.raw[item.name] = errored_result(item.expectations, exc)
        self.merged = None


# Result keys whose per-batch values are lists of examples: joined, then cut.
_PARTIAL = ("partial_unexpected_list", "partial_unexpected_index_list")
_COMPLETE = ("unexpected_list", "unexpected_index_list")


# Result key of a grouped merge (ItemBatches(group_by=...)): {group value: exact unexpected count}.
BY_GROUP = "trainflow_unexpected_by_group"


def _count_groups(result: dict | None, group_by: str, keep: int) -> None:
    """One batch's complete index list: its exact count per ``group_by`` value into
    ``result[BY_GROUP]``, then each value's entries cut at ``keep``."""
    raw = (result or {}).get("unexpected_index_list")
    if not (isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], dict) and group_by in raw[0]):
        return
    groups = raw[0][group_by]
    counts: dict = {}
    for g in groups:
        counts[str(g)] = counts.get(str(g), 0) + 1
    result[BY_GROUP] = counts
    result["unexpected_index_list"] = _cut_groups(raw, group_by, keep)


def _cut_groups(raw: list, group_by: str, keep: int) -> list:
    """A dict-of-lists index list with at most ``keep`` entries per ``group_by`` value (in order)."""
    seen: dict = {}
    take = []
    for i, g in enumerate(raw[0][group_by]):
        seen[str(g)] = seen.get(str(g), 0) + 1
        if seen[str(g)] <= keep:
            take.append(i)
    if len(take) == len(raw[0][group_by]):
        return raw
    return [{k: [v[i] for i in take] for k, v in raw[0].items()}]


def _merge_suite_results(acc, part, result_format: dict, keep: int, group_by: str | None = None):
    """``acc`` with ``part`` (the same suite on the next batch) added in; ``acc`` is changed."""
    limit = int(result_format.get("partial_unexpected_count", 20))
    # Matched by expectation, not position: GX orders results its own way (failed metrics last).
    parts = {_key(b.expectation_config): b for b in part.results}
    for a in acc.results:
        b = parts.get(_key(a.expectation_config))
        if b is None:
            continue
        if b.exception_info and b.exception_info.get("raised_exception") and not (
                a.exception_info and a.exception_info.get("raised_exception")):
            a.exception_info = b.exception_info
        ra, rb = a.result or {}, b.result or {}
        if "element_count" not in rb:
            continue  # a table-level result (column list, ...): the same for every batch
        for key in ("element_count", "missing_count", "unexpected_count"):
            if key in ra or key in rb:
                ra[key] = (ra.get(key) or 0) + (rb.get(key) or 0)
        for key in _PARTIAL:
            if key in rb:
                ra[key] = _join_complete(ra.get(key), rb[key], limit)
        grouped = group_by is not None and BY_GROUP in rb
        for key in _COMPLETE:
            if key in rb:
                if grouped and key == "unexpected_index_list":
                    ra[key] = _cut_groups(_join_complete(ra.get(key), rb[key], 1 << 62), group_by, keep)
                else:
                    ra[key] = _join_complete(ra.get(key), rb[key], keep)
        if grouped:
            counts = dict(ra.get(BY_GROUP) or {})
            for g, n in rb[BY_GROUP].items():
                counts[g] = counts.get(g, 0) + n
            ra[BY_GROUP] = counts
        if "partial_unexpected_counts" in rb:
            ra["partial_unexpected_counts"] = _join_counts(ra.get("partial_unexpected_counts"),
                                                           rb["partial_unexpected_counts"], limit)
        a.result = ra
    return acc


def _key(config) -> str:
    """An expectation's identity within its suite: its id, else its configuration's JSON."""
    if config is None:
        return ""
    return str(getattr(config, "id", None) or json.dumps(config.to_json_dict(), sort_keys=True, default=str))


def _join_complete(a, b, keep: int):
    """Two complete unexpected lists joined and cut at ``keep`` entries; the dict-of-lists form
    (``exclude_unexpected_values``) list by list."""
    a, b = list(a or []), list(b or [])

    def one(x: list) -> bool:
        return len(x) == 1 and isinstance(x[0], dict) and all(isinstance(v, list) for v in x[0].values())

    if one(a) and one(b):
        return [{k: (a[0].get(k, []) + b[0].get(k, []))[:keep] for k in {**a[0], **b[0]}}]
    if one(b) and not a:
        return [{k: v[:keep] for k, v in b[0].items()}]
    if one(a) and not b:
        return a
    return (a + b)[:keep]


def _join_counts(a, b, limit: int) -> list[dict]:
    """GX's ``partial_unexpected_counts`` of two batches added by value, most frequent first."""
    counts: dict = {}
    order: list = []
    for entry in [*(a or []), *(b or [])]:
        key = repr(entry.get("value"))
        if key not in counts:
            order.append(entry.get("value"))
            counts[key] = 0
        counts[key] += int(entry.get("count") or 0)
    ranked = sorted(range(len(order)), key=lambda i: -counts[repr(order[i])])
    return [{"value": order[i], "count": counts[repr(order[i])]} for i in ranked[:limit]]


def _restate(merged) -> None:
    """Percents, each expectation's success and the suite's statistics from the summed counts."""
    for evr in merged.results:
        r = evr.result or {}
        if "element_count" not in r or evr.exception_info and evr.exception_info.get("raised_exception"):
            continue
        n, unexpected = r.get("element_count") or 0, r.get("unexpected_count") or 0
        missing = r.get("missing_count")
        nonnull = n - missing if missing is not None else n
        # Only the keys GX wrote (it leaves some out by expectation).
        if "unexpected_percent_total" in r:
            r["unexpected_percent_total"] = unexpected / n * 100 if n > 0 else None
        if "missing_percent" in r:
            r["missing_percent"] = missing / n * 100 if n > 0 and missing is not None else None
        r["unexpected_percent"] = unexpected / nonnull * 100 if nonnull > 0 else None
        if "unexpected_percent_nonmissing" in r:
            r["unexpected_percent_nonmissing"] = r["unexpected_percent"]
        mostly = (evr.expectation_config.kwargs or {}).get("mostly", 1.0) if evr.expectation_config else 1.0
        evr.success = nonnull == 0 or (nonnull - unexpected) / nonnull >= mostly
    evaluated = len(merged.results)
    ok = sum(1 for evr in merged.results if evr.success)
    merged.success = ok == evaluated
    merged.statistics.update({"evaluated_expectations": evaluated, "successful_expectations": ok,
                              "unsuccessful_expectations": evaluated - ok,
                              "success_percent": ok / evaluated * 100 if evaluated else None})


def errored_result(expectations: list, exc: Exception) -> dict:
    """A suite result in GX's JSON shape where every expectation failed with ``exc``."""
    message = f"{type(exc).__name__}: {exc}"
    return {
        "success": False,
        "error": message,
        "results": [
            {
                "success": False,
                "expectation_config": e.configuration.to_json_dict(),
                "result": {},
                "exception_info": {"raised_exception": True, "exception_message": message},
            }
            for e in expectations
        ],
    }


def write_report(run: Run, items: list[Item], report_dir: Path, *, failures: list[dict],
                 rows: dict[str, int], skipped: list[dict]) -> dict:
    """Write ``gx_result.json``, the Data Docs and ``summary.md`` into ``report_dir``; return the report.

    The report (JSON-serialisable)::

        {"success": bool,        # no failure and no skipped check
         "n_expectations": int,  # checks: a stacked expectation counts once per column it covers
         "n_failed": int,        # == len(failures)
         "failures": [...], "duration_s": float,
         "warnings": [...],      # failures the plan reports without failing (severity "warning")
         "files": {"result_json", "summary_md", "data_docs"},   # data_docs None if not built
         "rows": {split: n}, "skipped": [{"split", "check", "reason"}],
         "gx": {"version", "expectations", "failed"}}            # GX's own counts
    """
    import great_expectations as gx

    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / RESULT_JSON).write_text(json.dumps(jsonable({
        "great_expectations_version": gx.__version__,
        "run_id": run.run_id.to_json_dict(),
        "success": all(r.get("success") for r in run.raw.values()),
        "validations": run.raw,
    }), indent=1, allow_nan=False))
    files = {
        "result_json": str(report_dir / RESULT_JSON),
        "summary_md": str(report_dir / SUMMARY_MD),
        "data_docs": build_data_docs(run.context, report_dir),
    }
    results = run.results(items)
    warnings = [f for f in failures if f.get("severity") == "warning"]
    failures = [f for f in failures if f.get("severity") != "warning"]
    report = jsonable({
        "success": not failures and not skipped,
        "n_expectations": sum(sum(item.covers) for item in items),
        "n_failed": len(failures),
        "failures": failures,
        "warnings": warnings,
        "duration_s": round(time.perf_counter() - run.started, 3),
        "files": files,
        "rows": rows,
        "skipped": skipped,
        "gx": {"version": gx.__version__, "expectations": len(results),
               "failed": sum(1 for _, evr in results if not evr.get("success"))},
    })
    (report_dir / SUMMARY_MD).write_text(summary_markdown(report))
    return report


def build_data_docs(context: Any, report_dir: Path) -> str | None:
    """Data Docs HTML under report_dir/data_docs; a warning and None if building fails."""
    base = (Path(report_dir) / DATA_DOCS_DIR).resolve()
    try:
        context.add_data_docs_site(
            site_name=DATA_DOCS_SITE,
            site_config={
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(base)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
                # Validation pages only: they show each expectation with its result; suite
                # pages would repeat the expectations and double the build time.
                "site_section_builders": {"expectations": "0", "profiling": "0"},
            },
        )
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
    except Exception as exc:  # noqa: BLE001 - docs are a convenience; the JSON is the record
        log.warning("Data Docs were not built (%s: %s); see %s", type(exc).__name__, exc, RESULT_JSON)
        return None
    index = base / "index.html"
    if not index.is_file():
        log.warning("Data Docs build wrote no %s", index)
        return None
    return str(index)
