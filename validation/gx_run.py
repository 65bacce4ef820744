"""The one Great Expectations runner: a task's validation plan in, the report and its files out.

A suite is a module with ``NAME``, ``SPLITS``, ``identity(params)`` and ``run(params, report_dir)``:
it reads its data itself (``validation.suite``, a table in Arrow batches) or hands derived frames to
:func:`validate` (``validation.text_suite``, ``validation.image_suite``). The task's plan names its
suite module by import path (``ValidationPlan.suite``: ``tasks/`` does not import ``validation/``, and a
plugin brings its own), imported when run, so there is no import cycle. GX is imported inside the
functions; the caller sets ``GX_ANALYTICS_ENABLED=false``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.printable import printable
from validation.report import (BY_GROUP, CELLS_COUNTED, MAX_EXAMPLES, exception_message, fmt_bound, index_records,
                               jsonable, summary_markdown, where)

log = logging.getLogger(__name__)

# GX's ephemeral context already has a site called "local_site": ours needs another name.
DATA_DOCS_SITE = "trainflow_data_docs"
RESULT_JSON, SUMMARY_MD, DATA_DOCS_DIR = "gx_result.json", "summary.md", "data_docs"


def suite_module(plan):
    """The suite module ``plan`` names (``ValidationPlan.suite``); ValueError naming one that is missing."""
    from importlib import import_module

    try:
        return import_module(plan.suite)
    except ModuleNotFoundError as exc:
        if exc.name is None or not plan.suite.startswith(exc.name):
            raise
        raise ValueError(f"validation plan: no suite module {plan.suite!r}") from None


def run_plan(plan, report_dir: Path) -> dict:
    """Validate what ``plan`` names and write the report files into ``report_dir``; the report
    (see :func:`write_report`). Never raises on bad data; DataUnavailableError for a missing file."""
    return suite_module(plan).run(plan.params, Path(report_dir))


def data_hash(paths: list[Path]) -> str:
    """sha256 over the bytes of ``paths`` as the workspace holds them (an edit nobody ``dvc add``-ed
    is never taken for validated); a folder of Parquet files by each file's name and bytes.
    Raises DataUnavailableError naming a missing file."""
    from core.errors import DataUnavailableError
    from core.hashing import file_sha256, sha256_json

    digests = []
    for path in map(Path, paths):
        if path.is_dir():
            from tasks.columnar import parquet_files

            digests.append([path.name, [[f.name, file_sha256(f)] for f in parquet_files(path)]])
        elif path.is_file():
            digests.append([path.name, file_sha256(path)])
        else:
            raise DataUnavailableError.not_pulled(path)
    return sha256_json(digests)


def suite_key(plan) -> str:
    """sha256 of the plan's suite's ``identity(params)``, the code of its module, this runner,
    ``validation.report`` and ``tasks.columnar`` (it reads the table suite's batches), and the installed
    GX version (GX is not imported): a change to any of them is a new suite."""
    from importlib.metadata import PackageNotFoundError, version

    from core.hashing import file_sha256, sha256_json

    suite = suite_module(plan)
    here = Path(__file__).resolve().parent
    code = [Path(suite.__file__), here / "gx_run.py", here / "report.py", here.parent / "tasks" / "columnar.py"]
    try:
        gx_version = version("great_expectations")
    except PackageNotFoundError:
        gx_version = "missing"
    return sha256_json({**suite.identity(plan.params), "code": [file_sha256(f) for f in code], "gx": gx_version})


def need_splits(suite_name: str, needed: tuple[str, ...], splits: dict) -> None:
    """ValueError naming the splits of ``needed`` that ``splits`` lacks."""
    missing = [s for s in needed if s not in splits]
    if missing:
        raise ValueError(f"the {suite_name} suite needs splits {list(needed)}; missing {missing}")


def validate(suite, params: dict, splits: dict, report_dir: Path) -> dict:
    """Run a derived-frame ``suite`` on ``splits`` (``{split: frame}``, every one of ``suite.SPLITS``)
    and write the report files into ``report_dir``. ValueError when a split is missing; never
    raises on bad data.

    The suite gives ``plan(params, splits)``: ``[{name, split, frame, checks: [(check name,
    expectation)], result_format}]``; ``failure(check, entry, kwargs, result, records)``: completes
    a failed result's entry in place (``records``: the unexpected rows as dicts of the index
    columns); ``message_column(entry)``; ``CHECK_ORDER``, the report's order within a split; and
    ``NOUN``, what a row is ("images").
    """
    started = time.perf_counter()
    need_splits(suite.NAME, suite.SPLITS, splits)
    items = plan_items(suite, params, splits)
    run = start_run(started)
    for item in items:
        run_item(run, item)
    return derived_report(suite, params, run, items, {s: int(len(splits[s])) for s in suite.SPLITS}, report_dir)


def plan_items(suite, params: dict, splits: dict) -> list[Item]:
    """The GX items of a derived-frame ``suite``'s ``plan(params, splits)``."""
    return [Item(p["name"], p["split"], suite.NAME, p["frame"], [e for _, e in p["checks"]], p["result_format"],
                 checks=[c for c, _ in p["checks"]]) for p in suite.plan(params, splits)]


def derived_report(suite, params: dict, run: Run, items: list[Item], rows: dict[str, int], report_dir: Path) -> dict:
    """The report of a derived-frame ``suite`` whose ``items`` ``run`` has validated (whole, or batch by
    batch with :class:`ItemBatches`), written into ``report_dir``; ``rows``: each split's count."""
    failures = [_derived_failure(suite, item, evr) for item, evr in run.results(items) if not evr.get("success")]
    if hasattr(suite, "warnings"):  # what the suite reports without failing (skipped hidden files)
        failures += suite.warnings(params)
    order = (*suite.SPLITS, "cross")
    failures.sort(key=lambda f: (order.index(f["split"]), suite.CHECK_ORDER.index(f["check"])))
    return write_report(run, items, report_dir, failures=failures, rows=rows, skipped=[])


def _derived_failure(suite, item: Item, evr: dict) -> dict:
    """A derived-frame suite's report entry (see ``validation.report``) for a failed result of ``item``."""
    config = evr.get("expectation_config") or {}
    kwargs = config.get("kwargs") or {}
    result = evr.get("result") or {}
    count = result.get("unexpected_count")
    # GX orders results its own way: they are matched to checks by expectation type and column.
    check = next((c for c, e in zip(item.checks, item.expectations)
                  if (e.expectation_type, getattr(e, "column", None)) == (config.get("type"), kwargs.get("column"))),
                 "other")
    out = {"split": item.split, "check": check, "expectation": config.get("type", "unknown"),
           "column": kwargs.get("column"), "unexpected_count": int(count) if count is not None else None,
           "examples": [], "rows": [], "detail": "failed"}
    if (error := exception_message(evr)) is not None:  # GX could not evaluate it (a missing column, a wrong type)
        out.update(unexpected_count=None, detail=f"could not be evaluated: {error}")
    elif check == "row_count":
        observed = result.get("observed_value")
        out.update(column=None, examples=[observed], detail=f"{observed} {suite.NOUN}, expected "
                   f"{fmt_bound(kwargs.get('min_value'))}..{fmt_bound(kwargs.get('max_value'))}")
    else:
        suite.failure(check, out, kwargs, result, [r for r in index_records(result) if isinstance(r, dict)])
    out = jsonable(out)
    out["message"] = f"{where(item.split, suite.message_column(out))}: {out['detail']}"
    return out


def name_rows(out: dict, records: list[dict], what: str, example: Callable, text: Callable,
              row: str | None = None) -> None:
    """Complete a failed check's entry with its first MAX_EXAMPLES ``records``: ``examples`` (each
    ``example(record)``), ``rows`` (each record's ``row``, where given) and the detail
    ``<unexpected_count> <what>: <text(record)>, ...``."""
    shown = records[:MAX_EXAMPLES]
    out.update(examples=[example(r) for r in shown], detail=f"{out['unexpected_count']} {what}: "
               + ", ".join(map(text, shown)) + (" ..." if len(records) > MAX_EXAMPLES else ""))
    if row is not None:
        out["rows"] = [r.get(row) for r in shown]


def leak_failure(out: dict, records: list[dict], key: str, splits: tuple[str, str], fields: tuple[str, ...],
                 what: str, name: Callable = lambda s, p: f"{s} {p[s + '_path']}") -> None:
    """Complete a derived frame's leak entry: one pair per ``key`` value found in both ``splits``
    (``{<split>_<field>}`` of its first record in each), each named ``name(split, pair)`` (its path)."""
    by_value: dict = {}
    for r in records:
        by_value.setdefault(r.get(key), {}).setdefault(r.get("split"), r)
    pairs = [{f"{s}_{k}": v.get(s, {}).get(k) for k in fields for s in splits} for v in by_value.values()]
    out["unexpected_count"] = len(pairs)
    name_rows(out, pairs, what, lambda p: p, lambda p: " = ".join(name(s, p) for s in splits))


def cross_frame(frames: dict, splits: tuple[str, ...], column: str, *keep: str):
    """Each split's distinct non-null values of ``column`` (its first row's ``keep`` columns beside
    them), concatenated: a value seen twice is in two splits."""
    import pandas as pd

    parts = []
    for split in splits:
        df = frames[split]
        df = df[df[column].notna()].drop_duplicates(column, keep="first")
        parts.append(pd.DataFrame({column: df[column].to_numpy(dtype=object), "split": split,
                                   **{k: df[k].to_numpy(dtype=object if k == "path" else None) for k in keep}}))
    return pd.concat(parts, ignore_index=True)


def complete(*index_columns: str) -> dict:
    """Every unexpected row of a derived frame, as ``index_columns`` (the domain column included).

    COMPLETE, so a stacked frame yields every (column, row) pair and exact per-column counts;
    ``exclude_unexpected_values``: one dict of lists instead of a dict per row. With a named index
    holding ``index_columns``, GX reads them from the index tuple instead of one ``.at`` per cell.
    """
    return {"result_format": "COMPLETE", "unexpected_index_column_names": list(index_columns),
            "exclude_unexpected_values": True, "return_unexpected_index_query": False}


SUMMARY = {"result_format": "SUMMARY", "partial_unexpected_count": 5, "return_unexpected_index_query": False}


@dataclass
class Item:
    """One derived frame to validate: GX data asset, suite and validation definition ``trainflow_<name>``.

    ``split``/``kind`` tell the report where its results came from; ``covers[i]`` is how many
    checks expectation ``i`` stands for (a stacked expectation: one per column it covers; none: one each);
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


@dataclass
class Run:
    context: Any
    run_id: Any
    raw: dict[str, dict]          # item name -> GX suite result (JSON form)
    started: float

    def results(self, items: list[Item]) -> list[tuple[Item, dict]]:
        """Every expectation result with the item it came from, in plan order."""
        return [(item, evr) for item in items for evr in self.raw[item.name].get("results", [])]


def start_run(started: float) -> Run:
    """An ephemeral GX context with the pandas data source items are validated in (progress bars off);
    ``started``: the ``time.perf_counter()`` the report's duration counts from."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.data_sources.add_pandas(name="trainflow")
    return Run(context=context, run_id=gx.RunIdentifier(run_name="trainflow-validate"), raw={}, started=started)


def _definition(run: Run, item: Item):
    """The item's GX data asset, suite and validation definition, added to the run's context."""
    import great_expectations as gx

    batch = run.context.data_sources.get("trainflow").add_dataframe_asset(
        name=item.name).add_batch_definition_whole_dataframe(name=f"{item.name}_whole")
    suite = run.context.suites.add(gx.ExpectationSuite(name=f"trainflow_{item.name}", expectations=item.expectations))
    return run.context.validation_definitions.add(
        gx.ValidationDefinition(name=f"trainflow_{item.name}", data=batch, suite=suite))


def _errored(run: Run, item: Item, exc: Exception) -> None:
    """Data GX chokes on: every expectation of ``item`` fails with the exception's message."""
    log.warning("GX could not validate %s: %s: %s", item.name, type(exc).__name__, exc)
    message = f"{type(exc).__name__}: {exc}"
    run.raw[item.name] = {"success": False, "error": message, "results": [
        {"success": False, "expectation_config": e.configuration.to_json_dict(), "result": {},
         "exception_info": {"raised_exception": True, "exception_message": message}} for e in item.expectations]}


def run_item(run: Run, item: Item) -> None:
    """Validate ``item.frame`` whole (GX stores the result for the Data Docs); into ``run.raw``."""
    definition = _definition(run, item)
    try:
        run.raw[item.name] = definition.run(batch_parameters={"dataframe": item.frame},
                                            result_format=item.result_format, run_id=run.run_id).to_json_dict()
    except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
        _errored(run, item, exc)


class ItemBatches:
    """``item``'s suite validated batch by batch (:meth:`add`) and kept as ONE result (:meth:`finish`):
    what :func:`run_item` gives on the whole table, in bounded memory.

    Each batch frame's index holds the rows' positions in the whole table. Counts are summed, percents
    and success recomputed (``mostly`` honoured), example lists cut (index lists at ``CELLS_COUNTED``
    entries; with ``group_by``, an index column such as ``cell_column``, per value, each value's exact
    count in ``result[BY_GROUP]``). Only the merged result is stored: one Data Docs page per item.
    """

    def __init__(self, run: Run, item: Item, group_by: str | None = None):
        self.run, self.item, self.group_by = run, item, group_by
        self.definition = _definition(run, item)
        self.merged = self.batch_id = None
        self.error: Exception | None = None
        self.batches = 0

    def _validate(self, frame):
        from great_expectations.validator.v1_validator import Validator

        if self.batch_id is None:
            # The first batch as run_item validates it, its result stored under the key finish's
            # merged one replaces; the rest with GX's Validator alone (nothing stored, no re-check).
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
        batch, where ``frame`` holds only the rows that can fail (the caller knows the batch's counts)."""
        if self.error is not None:
            return
        try:
            part = self._validate(frame)
            self.batches += 1
            keys = {_key(self.definition.suite.expectations[i].configuration): c for i, c in (counts or {}).items()}
            for evr in part.results:
                if keys and evr.result is not None and _key(evr.expectation_config) in keys:
                    evr.result.update(keys[_key(evr.expectation_config)])
                if self.group_by:
                    _count_groups(evr.result, self.group_by, CELLS_COUNTED)
            self.merged = part if self.merged is None else _merge_suite_results(
                self.merged, part, self.item.result_format, self.group_by)
        except Exception as exc:  # noqa: BLE001 - report, never crash on data GX chokes on
            self.error = exc

    def finish(self, whole: dict | None = None) -> None:
        """Store the merged result into ``run.raw``. ``whole``: ``{expectation index: frame}`` for
        the expectations that need the whole table (a row count), each validated by GX on its own
        frame (one with the table's N rows and no columns costs no memory) instead of per batch."""
        from great_expectations.data_context.types.resource_identifiers import (ExpectationSuiteIdentifier,
                                                                                 ValidationResultIdentifier)

        run, item, merged = self.run, self.item, self.merged
        try:
            if self.error is not None:
                raise self.error
            if merged is None:
                raise ValueError(f"{item.name}: no batch was validated")
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
            _errored(run, item, exc)
        self.merged = None


def _count_groups(result: dict | None, group_by: str, keep: int) -> None:
    """One batch's complete index list: its exact count per ``group_by`` value into
    ``result[BY_GROUP]``, then each value's entries cut at ``keep``."""
    raw = (result or {}).get("unexpected_index_list")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], dict) and group_by in raw[0]:
        result[BY_GROUP] = dict(Counter(str(g) for g in raw[0][group_by]))
        result["unexpected_index_list"] = _cut_groups(raw, group_by, keep)


def _cut_groups(raw: list, group_by: str, keep: int) -> list:
    """A dict-of-lists index list with at most ``keep`` entries per ``group_by`` value (in order)."""
    seen: Counter = Counter()
    take = []
    for i, g in enumerate(raw[0][group_by]):
        seen[str(g)] += 1
        if seen[str(g)] <= keep:
            take.append(i)
    return raw if len(take) == len(raw[0][group_by]) else [{k: [v[i] for i in take] for k, v in raw[0].items()}]


def _merge_suite_results(acc, part, result_format: dict, group_by: str | None):
    """``acc`` with ``part`` (the same suite on the next batch) added in; ``acc`` is changed."""
    limit = int(result_format.get("partial_unexpected_count", 20))
    # Matched by expectation, not position: GX orders results its own way (failed metrics last).
    parts = {_key(b.expectation_config): b for b in part.results}
    for a in acc.results:
        b = parts.get(_key(a.expectation_config))
        if b is None:
            continue
        if _raised(b) and not _raised(a):
            a.exception_info = b.exception_info
        ra, rb = a.result or {}, b.result or {}
        if "element_count" not in rb:
            continue  # a table-level result (column list, ...): the same for every batch
        for key in ("element_count", "missing_count", "unexpected_count"):
            if key in ra or key in rb:
                ra[key] = (ra.get(key) or 0) + (rb.get(key) or 0)
        grouped = BY_GROUP in rb  # only a grouped merge's batches count groups
        for key in ("partial_unexpected_list", "partial_unexpected_index_list", "unexpected_list",
                    "unexpected_index_list"):
            if key not in rb:
                continue
            if grouped and key == "unexpected_index_list":
                ra[key] = _cut_groups(_join_complete(ra.get(key), rb[key], 1 << 62), group_by, CELLS_COUNTED)
            else:
                ra[key] = _join_complete(ra.get(key), rb[key], limit if key.startswith("partial") else CELLS_COUNTED)
        if grouped:
            ra[BY_GROUP] = dict(Counter(ra.get(BY_GROUP) or {}) + Counter(rb[BY_GROUP]))
        if "partial_unexpected_counts" in rb:
            ra["partial_unexpected_counts"] = _join_counts(ra.get("partial_unexpected_counts"),
                                                           rb["partial_unexpected_counts"], limit)
        a.result = ra
    return acc


def _raised(evr) -> bool:
    return bool(evr.exception_info and evr.exception_info.get("raised_exception"))


def _key(config) -> str:
    """An expectation's identity within its suite: its id, else its configuration's JSON."""
    if config is None:
        return ""
    return str(getattr(config, "id", None) or json.dumps(config.to_json_dict(), sort_keys=True, default=str))


def _join_complete(a, b, keep: int):
    """Two unexpected lists joined and cut at ``keep`` entries; the dict-of-lists form
    (``exclude_unexpected_values``) list by list."""
    a, b = list(a or []), list(b or [])

    def one(x: list) -> bool:
        return len(x) == 1 and isinstance(x[0], dict) and all(isinstance(v, list) for v in x[0].values())

    if (a or b) and (one(a) or not a) and (one(b) or not b):
        x, y = (a or [{}])[0], (b or [{}])[0]
        return [{k: (x.get(k, []) + y.get(k, []))[:keep] for k in {**x, **y}}]
    return (a + b)[:keep]


def _join_counts(a, b, limit: int) -> list[dict]:
    """GX's ``partial_unexpected_counts`` of two batches added by value, most frequent first."""
    values: dict = {}
    counts: Counter = Counter()
    for entry in [*(a or []), *(b or [])]:
        key = repr(entry.get("value"))
        values.setdefault(key, entry.get("value"))
        counts[key] += int(entry.get("count") or 0)
    ranked = sorted(values, key=lambda k: -counts[k])  # stable: ties stay in first-seen order
    return [{"value": values[k], "count": counts[k]} for k in ranked[:limit]]


def _restate(merged) -> None:
    """Percents, each expectation's success and the suite's statistics from the summed counts."""
    for evr in merged.results:
        r = evr.result or {}
        if "element_count" not in r or _raised(evr):
            continue
        n, unexpected, missing = r.get("element_count") or 0, r.get("unexpected_count") or 0, r.get("missing_count")
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
        "great_expectations_version": gx.__version__, "run_id": run.run_id.to_json_dict(),
        "success": all(r.get("success") for r in run.raw.values()), "validations": run.raw,
    }), indent=1, allow_nan=False))
    files = {"result_json": str(report_dir / RESULT_JSON), "summary_md": str(report_dir / SUMMARY_MD),
             "data_docs": build_data_docs(run.context, report_dir)}
    results = run.results(items)
    # A message names files, columns and classes from the data: each stays one line wherever it is shown.
    failures = [{**f, **{k: printable(f[k]) for k in ("message", "detail") if isinstance(f.get(k), str)}}
                for f in failures]
    warnings = [f for f in failures if f.get("severity") == "warning"]
    failures = [f for f in failures if f.get("severity") != "warning"]
    report = jsonable({
        "success": not failures and not skipped,
        "n_expectations": sum(sum(item.covers) if item.covers else len(item.expectations) for item in items),
        "n_failed": len(failures), "failures": failures, "warnings": warnings,
        "duration_s": round(time.perf_counter() - run.started, 3),
        "files": files, "rows": rows, "skipped": skipped,
        "gx": {"version": gx.__version__, "expectations": len(results),
               "failed": sum(1 for _, evr in results if not evr.get("success"))},
    })
    (report_dir / SUMMARY_MD).write_text(summary_markdown(report))
    return report


def build_data_docs(context: Any, report_dir: Path) -> str | None:
    """Data Docs HTML under report_dir/data_docs; a warning and None if building fails."""
    base = (Path(report_dir) / DATA_DOCS_DIR).resolve()
    try:
        context.add_data_docs_site(site_name=DATA_DOCS_SITE, site_config={
            "class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(base)},
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            # Validation pages only: suite pages would repeat the expectations and double the build time.
            "site_section_builders": {"expectations": "0", "profiling": "0"},
        })
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
    except Exception as exc:  # noqa: BLE001 - docs are a convenience; the JSON is the record
        log.warning("Data Docs were not built (%s: %s); see %s", type(exc).__name__, exc, RESULT_JSON)
        return None
    index = base / "index.html"
    if not index.is_file():
        log.warning("Data Docs build wrote no %s", index)
        return None
    return str(index)
