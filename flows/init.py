"""``trainflow init``: turn data the user brings into a runnable, reviewed pipeline.

The data is tracked with DVC in the local cache only (the user's data never goes to the bundled remote);
a re-run on changed data updates the data facts and the expectations, keeps the user's own keys and shows
the diff. Bad input is refused before anything changes.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from core.errors import TrainflowError
from core.printable import printable

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
# What init writes besides the task's own defaults (``Task.init_defaults``).
EPOCHS = 30
PROFILE_MARGIN = 0.1
# The dataset keys init takes from the data on every run (the rest of an existing config is the user's).
DATA_FACTS = ("dvc_file", "path", "file", "train_file", "test_file", "test_fraction", "label", "expectations_file")


class InitError(TrainflowError):
    """The data, the label or the project cannot be set up as asked; the message says why."""


def init_project(root: Path, data: str | Path, label: str | None, task: str | None = None, name: str | None = None,
                 test_fraction: float | None = None) -> dict[str, Any]:
    """Track ``data`` with DVC, profile it into an expectations file and write a pipeline config.

    ``data`` (relative to ``root`` unless absolute): a folder of ``train`` + ``test`` tables or of one
    table, one table file, or (no ``label``) a folder a task reads by itself (``Task.init_reads``). Side
    effects: ``dvc add`` (local cache) and the files under ``configs/``; InitError (bad input) comes first.
    """
    from core.expectations import load_expectations
    from tasks import get_task
    from tasks.table import read_table
    from validation.profile import column_type, profile_table

    root = Path(root).resolve()
    target, rel = _inside(root, data)
    if (folder := _folder_task(task, target, label)) is not None:
        return _init_folder(root, target, rel, *folder, name)
    layout, table_paths = _layout(target, rel)
    name, config_rel, before, old = _existing(root, target, name, ".expectations.yaml")
    exp_rel = f"configs/{name}.expectations.yaml"
    old_columns = None  # the columns the existing expectations file lists, if it can be read
    if exp_rel in before:
        with contextlib.suppress(TrainflowError):
            old_columns = set(load_expectations(root / exp_rel).names)

    first, first_rel = read_table(table_paths[0]), _rel(root, table_paths[0])
    columns = label_columns(first, label, first_rel)
    if len(first) == 0:
        raise InitError(f"{first_rel} has no rows")
    labels = first[label].dropna()
    if labels.empty:
        raise InitError(f"label {label!r} has no value in {first_rel}: nothing to learn from")
    if task is None and old is not None and isinstance(old.get("task"), str):
        _task(old["task"], labels, label, column_type(labels))  # still fits the data
        task, task_reason, inferred, others = old["task"], "kept from the existing config", False, []
    else:
        task, task_reason, inferred, others = _task(task, labels, label, column_type(labels))
    chosen = get_task(task)

    dataset = split_keys(target, rel, layout, test_fraction, ((old or {}).get("dataset") or {}).get("test_fraction"))
    dataset.update(label=label, expectations_file=exp_rel)
    raw = _raw_config(name, task, dataset, {"epochs": EPOCHS, "strategy": "ddp"}, chosen.init_defaults())
    cfg = _checked(raw, "the config init would write is invalid: {}")

    try:  # the table's half: its rows, the choices made from them, the expectations profiled
        table = chosen.init_table(cfg, root, first_rel, lambda frames, label, class_label, **kw: profile_table(
            frames, label, class_label, PROFILE_MARGIN, **kw))
    except ValueError as exc:
        raise InitError(str(exc)) from None
    frames, choices, expectations, unlabeled = table["frames"], table["choices"], table["expectations"], \
        table["unlabeled"]
    dataset.update(table["dataset"])
    raw["training"].update(choices["training"])
    _metric_keys(raw, choices)
    if old is not None:
        raw = _updated(old, raw, old_columns, columns)
    _checked(raw, config_rel + ": the updated config is invalid: {}; fix that key in it, then run init again")

    made = choice_lines(choices, unlabeled)
    intro = "# Choices made from the data (edit the keys named; init run again keeps your edits):\n" if made else ""
    return {
        "task_inferred": inferred, "task_reason": task_reason, "other_tasks": others, "layout": layout,
        "rows": {s: len(df) for s, df in frames.items()}, "columns": len(expectations.columns),
        "classes": expectations.classes, "choices": choices, "unlabeled": unlabeled, "expectations": exp_rel,
        **_write(root, target, rel, name, raw, (task, task_reason, inferred, intro, made), before,
                 {exp_rel: lambda md5: expectations.to_yaml(_expectations_header(rel, md5))}),
    }


def label_columns(frame, label: str, where: str) -> list[str]:
    """The table's column names; InitError naming the closest one when ``label`` is none of them."""
    columns = [str(c) for c in frame.columns]
    if label not in columns:
        close = difflib.get_close_matches(label, columns, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InitError(f"--label {label!r} is not a column of {where}{hint}; its columns are {columns}")
    return columns


def split_keys(target: Path, rel: str, layout: dict[str, str], test_fraction: float | None,
               kept: Any = None) -> dict[str, Any]:
    """The dataset keys of the data at ``target``: its DVC file, folder and files, and for one table to
    split ``test_fraction`` (the one given, else the ``kept`` one, else the default)."""
    from core.config import DatasetConfig

    if test_fraction is not None and not 0 < test_fraction < 1:
        raise InitError(f"--test-fraction: must be between 0 and 1, got {test_fraction}")
    path = rel if target.is_dir() else Path(rel).parent.as_posix()
    dataset: dict[str, Any] = {"dvc_file": f"{rel}.dvc", "path": path, **layout}
    if "file" in layout:
        dataset["test_fraction"] = test_fraction if test_fraction is not None else (
            kept if isinstance(kept, float) else DatasetConfig.model_fields["test_fraction"].default)
    elif test_fraction is not None:
        raise InitError("--test-fraction: the data is already split into train and test files")
    return dataset


def _ask(task: str, ask: Callable[[Any], Any]):
    """``ask(the task named task)``; InitError naming ``--task`` when it cannot be loaded."""
    from tasks import get_task

    try:
        return ask(get_task(task))
    except TrainflowError as exc:
        raise InitError(f"--task {task!r}: {exc}") from None


def _answers(ask: Callable[[Any], Any]) -> Iterator[tuple[str, Any]]:
    """``(name, ask(task))`` for each registered task; a plugin that cannot be loaded is not a candidate."""
    from tasks import get_task, names

    for name in names():
        try:
            answer = ask(get_task(name))
        except TrainflowError:
            continue
        yield name, answer


def _folder_task(task: str | None, target: Path, label: str | None) -> tuple[str, str, bool] | None:
    """(task, why, inferred) when ``target`` is data a task sets up by itself (``Task.init_reads``): the
    given ``task``, or with no ``label`` the first that reads it; else None (a table)."""
    if task is not None:
        fit = _ask(task, lambda t: t.init_reads(target))
        if fit.fits:
            return task, fit.why, False
        if label is None:
            raise InitError(f"--task {task}: {fit.why}; for a table, name its label column with --label")
        return None
    if label is not None:
        return None
    why = []
    for name, fit in _answers(lambda t: t.init_reads(target)):
        if fit.fits and fit.preferred:
            return name, fit.why, True
        why.append(f"{name}: {fit.why}")
    raise InitError(f"--label: name the column to predict for a table; no task reads {target.name} by itself "
                    f"({'; '.join(why)})")


def _init_folder(root: Path, target: Path, rel: str, task: str, task_reason: str, inferred: bool,
                 name: str | None) -> dict[str, Any]:
    """``init_project`` for data a task sets up by itself (``Task.init_folder``); no expectations file."""
    from core.config import merge_config
    from core.errors import DataUnavailableError
    from tasks import get_task

    if not target.is_dir():
        raise InitError(f"--data {rel}: task {task} reads a folder, not a file")
    name, config_rel, before, old = _existing(root, target, name)
    chosen = get_task(task)
    try:
        facts = chosen.init_folder(root, target, rel)
    except DataUnavailableError as exc:
        raise InitError(str(exc)) from None
    if facts.get("data"):  # the task wrote the data anew (an image folder as tar shards): DVC tracks that
        rel = facts["data"]
        target = root / rel
    raw = _raw_config(name, task, {"dvc_file": f"{rel}.dvc", "path": rel, **facts["dataset"]},
                      {"strategy": "ddp", **facts["training"]}, chosen.init_defaults())
    if old is not None:  # the user's keys stay; the data's facts (``dataset``) are new but for the user's choices
        fresh = raw
        raw = merge_config(fresh, old)
        raw["dataset"] = {**(old.get("dataset") or {}), **fresh["dataset"]}
        for path in facts["choices"]:
            if (kept := _get(old, path)) is not None:
                _set(raw, path, kept)
    _checked(raw, config_rel + ": the config init would write is invalid: {}")
    intro = (f"# Review {facts['review']}, then commit this file:\n"
             "# validation checks every later version of the data against them. Decided from the data:\n")
    return {
        "task_inferred": inferred, "task_reason": task_reason, "rows": facts["rows"], "classes": facts["classes"],
        "lines": facts["lines"], "problems": facts["problems"], "review": facts["review"], "expectations": None,
        **_write(root, target, rel, name, raw, (task, task_reason, inferred, intro, facts["lines"]), before),
    }


def _existing(root: Path, target: Path, name: str | None, *suffixes: str) -> tuple[str, str, dict, dict | None]:
    """(name, config path, texts of its existing files, the config's YAML as written or None); refuses
    tracked data and a config that cannot be read as a mapping."""
    from core.config import load_yaml

    name = _name(name, target)
    config_rel = f"configs/{name}.yaml"
    before = {p: (root / p).read_text() for p in (config_rel, *(f"configs/{name}{s}" for s in suffixes))
              if (root / p).is_file()}
    old = None
    if config_rel in before:
        try:
            old = load_yaml(before[config_rel])
        except TrainflowError as exc:
            raise InitError(f"{config_rel} exists but cannot be read ({exc}); fix it or move it away, then run "
                            "init again") from None
        if not isinstance(old, dict):
            raise InitError(f"{config_rel} exists but is not a mapping of keys; fix it or move it away")
    _check_not_inside_tracked(root, target)
    return name, config_rel, before, old


def _checked(raw: dict, message: str):
    """The config ``raw`` is; InitError ``message`` (``{}``: the error) when it is invalid."""
    from core.config import config_from_dict

    try:
        return config_from_dict(raw)
    except TrainflowError as exc:
        raise InitError(message.format(exc)) from None


def _metric_keys(raw: dict, choices: dict) -> None:
    """The metric init picked (``primary_metric``, and early stopping on it where the engine takes it)
    and the loss weights (``training.class_weight``) into ``raw``."""
    from pydantic import ValidationError

    from core.config import EarlyStopping

    metric = (choices.get("metric") or (None, ""))[0]
    if metric is not None:
        raw["primary_metric"] = metric
        try:  # early stopping follows the metric where the engine can stop on it
            EarlyStopping(metric=f"val_{metric}")
            raw["training"]["early_stopping"] = {**raw["training"].get("early_stopping", {}),
                                                 "metric": f"val_{metric}"}
        except ValidationError:
            pass
    if choices.get("class_weight"):
        raw["training"]["class_weight"] = choices["class_weight"][0]


def _raw_config(name: str, task: str, dataset: dict, training: dict, defaults: dict) -> dict[str, Any]:
    return {"name": name, "task": task, "dataset": dataset, "model": defaults["model"], "training": training,
            "gates": defaults["gates"], "registry": {"model_name": name, "experiment": f"trainflow-{name}"}}


def _write(root: Path, target: Path, rel: str, name: str, raw: dict, why: tuple[str, str, bool, str, list[str]],
           before: dict[str, str], more: dict[str, Callable[[str], str]] | None = None) -> dict[str, Any]:
    """``dvc add`` the data, write ``configs/NAME.yaml`` (``raw`` under a header: ``why`` = the task, its
    reason, whether inferred, an intro to the ``lines`` listed) and the ``more`` files (``path: text(md5)``);
    the result's shared keys, with the diff of each file that existed."""
    import yaml

    md5 = _dvc_add(root, rel)
    (root / "configs").mkdir(exist_ok=True)
    task, reason, inferred, intro, lines = why
    config_rel = f"configs/{name}.yaml"
    header = (printable(f"# Written by `trainflow init` for {rel} (DVC md5 {md5}).") + "\n"
              + printable(f"# task: {task} ({'inferred: ' if inferred else ''}{reason}).") + "\n"
              + intro + "".join(printable(f"#   {line}") + "\n" for line in lines)
              + f"# Every key not here keeps its default (core/config.py). Run: trainflow run --config {config_rel}\n")
    texts = {config_rel: header + yaml.safe_dump(raw, sort_keys=False, default_flow_style=False),
             **{path: text(md5) for path, text in (more or {}).items()}}
    for path, text in texts.items():
        (root / path).write_text(text)
    gitignore = _rel(root, target.parent / ".gitignore")
    return {"name": name, "task": task, "data": rel, "dvc_file": f"{rel}.dvc", "md5": md5, "config": config_rel,
            "updated": [p for p in texts if p in before],
            "diff": {p: "".join(difflib.unified_diff(before[p].splitlines(True), texts[p].splitlines(True),
                                                     f"{p} (before)", f"{p} (now)", n=1)) for p in texts if p in before},
            "git_add": [f"{rel}.dvc", *([gitignore] if (root / gitignore).is_file() else []), *texts],
            "next": f"trainflow run --config {config_rel}"}


def _get(data: dict, path: tuple[str, ...]):
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _set(data: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


def _updated(old: dict, fresh: dict, old_columns: set[str] | None, columns: list[str]) -> dict:
    """The existing config ``old`` with the data facts of ``fresh``: every key the user has keeps its value,
    the files and label come from the data, ``exclude``/``categorical`` keep the user's entries still in
    the data and add init's choices for new columns, ``features`` loses columns that are gone."""
    from core.config import merge_config

    out = merge_config(fresh, old)
    ds, fresh_ds, old_ds = dict(out.get("dataset") or {}), fresh["dataset"], old.get("dataset") or {}
    for key in DATA_FACTS:
        if key in fresh_ds:
            ds[key] = fresh_ds[key]
        else:
            ds.pop(key, None)
    new = [c for c in columns if old_columns is None or c not in old_columns]
    for key in ("exclude", "categorical"):
        kept = [c for c in old_ds.get(key) or [] if c in columns]
        values = kept + [c for c in fresh_ds.get(key, []) if c in new and c not in kept]
        if values:
            ds[key] = values
        else:
            ds.pop(key, None)
    if isinstance(old_ds.get("features"), list):
        ds["features"] = [c for c in old_ds["features"] if c in columns]
    if "leak_policy" not in old_ds and "leak_policy" in fresh_ds:
        ds["leak_policy"] = fresh_ds["leak_policy"]
    out["dataset"] = ds
    return out


def format_report(r: dict[str, Any]) -> str:
    """What ``trainflow init`` prints: what it did and chose, what to review and commit, what to run next."""
    table = "lines" not in r
    rows = ", ".join(f"{k} {v}" for k, v in r["rows"].items())
    task = f"task:         {r['task']} ({'inferred: ' if r['task_inferred'] else ''}{r['task_reason']})"
    dvc = f"dvc add:      {r['dvc_file']} (md5 {r['md5']}), in the local DVC cache"
    if table:
        split = (f"one table {r['layout']['file']}, split into train/test by seed" if "file" in r["layout"]
                 else f"{r['layout']['train_file']} + {r['layout']['test_file']}")
        if r["task_inferred"] and r.get("other_tasks"):
            task += f"; pass --task {' or --task '.join(r['other_tasks'])} to change it"
        lines = [f"data:         {r['data']} ({split}; {rows} rows, {r['columns']} columns)", task,
                 *([f"classes:      {r['classes']}"] if r["classes"] else []), f"name:         {r['name']}",
                 *choice_lines(r["choices"], r.get("unlabeled", 0)), dvc,
                 f"expectations: {r['expectations']}  <- review it: validation checks every data version against it",
                 f"config:       {r['config']}"]
    else:
        lines = [f"data:         {r['data']} ({rows} files)", task, f"name:         {r['name']}", *r["lines"], dvc,
                 f"config:       {r['config']}  <- review {r['review']}: validation checks every data version "
                 "against them"]
    lines = [printable(line) for line in lines]
    if r.get("updated"):
        facts = "the data facts and the expectations are" if table else "the data facts are"
        lines += ["", f"Updated {' and '.join(r['updated'])}: {facts} new, every other key of yours is kept. "
                      "What changed:"]
        for path, diff in r["diff"].items():
            lines += [diff.rstrip("\n")] if diff else [f"    {path}: unchanged"]
    if table:
        lines += ["", "After a schema change (columns added, removed or retyped), run this same init command again:",
                  "it refreshes the data facts and the expectations and keeps your own keys."]
    lines += [
        "",
        "Your data is in this repository's local DVC cache only, and runs work from it. To share it",
        "(and to let a fresh clone `dvc pull` it), add your own DVC remote and push:",
        "    dvc remote add -d myremote /path/or/s3://bucket/path",
        "    dvc push",
        "(The bundled remote dvc-store/ serves only the shipped examples, named in their own .dvc",
        "files; with no default remote, `dvc push` refuses rather than put your data in git.)",
        "",
        "Commit:",
        printable(f"    git add {' '.join(r['git_add'])}"),
        f"    git commit -m 'trainflow init: {r['name']}'",
        "Next:",
        f"    {r['next']}",
    ]
    return "\n".join(lines)


def choice_lines(choices: dict, unlabeled: int = 0) -> list[str]:
    """The choices init made from the data, one line each with its reason (output and config comments)."""
    out = [f"excluded:     {col}: {why} (dataset.exclude)" for col, why in choices.get("exclude", {}).items()]
    out += [f"categorical:  {col}: {why} (dataset.categorical)" for col, why in choices.get("categorical", {}).items()]
    out += [f"dates:        {col}: {d['why']}: becomes {date_parts_text(d['format'])} (dataset.dates; "
            "dataset.date_parts picks the parts)" for col, d in (choices.get("dates") or {}).items()]
    if choices.get("patience_why"):
        out.append(f"early stop:   {choices['patience_why']} (training.early_stopping)")
    for key, what in (("imputed", "the model fills in the train median and gets a missing-indicator input"),
                      ("missing_category", "\"missing\" is a category of its own")):
        if choices.get(key):
            out.append(f"missing:      {', '.join(f'{c} ({n})' for c, n in choices[key].items())}: {what}")
    dup = choices.get("duplicates") or {}
    if dup.get("within"):
        out.append(f"duplicates:   {dup['within']} repeated row(s): each stays on one side of a split trainflow makes")
    if dup.get("test_in_train"):
        out.append(f"duplicates:   {dup['test_in_train']} test row(s) also in train: reported by validation, not "
                   "refused (dataset.leak_policy: warn; set fail to refuse such data)")
    if choices.get("metric"):
        out.append(f"metric:       {choices['metric'][1]} (primary_metric"
                   + (")" if choices["metric"][0] else ": left out, the task's default)"))
    if choices.get("class_weight"):
        out.append(f"weights:      {choices['class_weight'][1]} (training.class_weight)")
    if unlabeled:
        out.append(f"unlabeled:    {unlabeled} row(s) without a label: left out of training and evaluation")
    return out


def date_parts_text(fmt: str) -> str:
    """The parts a date column of ``fmt`` becomes, in words."""
    from core.config import DatasetConfig
    from tasks.encoding import date_columns

    words = {"year": "year", "month": "month", "day": "day of month", "weekday": "day of week",
             "dayofyear": "day of year", "hour": "hour", "days": "days since 1970-01-01", "missing": "a missing flag"}
    parts = date_columns("", fmt, DatasetConfig.model_fields["date_parts"].default)
    return ", ".join(words[p] for p in parts)


def slugify(text: str) -> str:
    """A pipeline name from a file or folder name: lower case, [a-z0-9_-], starting with a letter."""
    slug = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-_"))
    return slug if slug[:1].isalpha() else f"data-{slug}".rstrip("-")


def _inside(root: Path, data: str | Path) -> tuple[Path, str]:
    """``data``'s absolute path and its path in the DVC repository ``root``; InitError where it is not one."""
    if not (root / ".dvc").is_dir():
        raise InitError(f"{root} is not a DVC repository (no .dvc/ folder); run `git init && dvc init` there first")
    path = Path(data)
    path = (path if path.is_absolute() else root / path).resolve()
    try:
        rel = path.relative_to(root)
    except ValueError:
        raise InitError(f"--data {data} is outside the repository {root}: DVC tracks data inside it. "
                        f"Copy or move it under {root / 'data'} first, then run init on that copy") from None
    if not rel.parts:
        raise InitError("--data is the repository root; give the folder or file that holds the table")
    if rel.parts[0] in (".git", ".dvc"):
        raise InitError(f"--data {rel.as_posix()} is inside {rel.parts[0]}/, which belongs to git/DVC")
    if not path.exists():
        raise InitError(f"--data {data}: no such file or folder")
    return path, rel.as_posix()


def _layout(target: Path, rel: str, suffixes: tuple[str, ...] = TABLE_SUFFIXES,
            what: str = "table") -> tuple[dict[str, str], list[Path]]:
    """The dataset keys for the files at ``target`` (each a ``what`` of ``suffixes``), and those files
    (the first holds the label)."""
    exts, kinds = " or ".join(suffixes[:2]), "|".join(s.lstrip(".") for s in suffixes[:2])
    if target.is_file():
        if target.suffix.lower() not in suffixes:
            raise InitError(f"--data {rel}: not a {what}; use a {exts} file (or a folder of them)")
        return {"file": target.name}, [target]
    tables = sorted(p for p in target.iterdir() if p.is_file() and p.suffix.lower() in suffixes)
    split = {stem: [p for p in tables if p.stem.lower() == stem] for stem in ("train", "test")}
    for stem, found in split.items():
        if len(found) > 1:
            raise InitError(f"--data {rel}: more than one {stem} {what} ({[p.name for p in found]}); keep one")
    train, test = (found[0] if found else None for found in split.values())
    if train and test:
        return {"train_file": train.name, "test_file": test.name}, [train, test]
    if train or test:
        raise InitError(f"--data {rel}: has {(train or test).name} but no {'test' if train else 'train'} {what}; "
                        f"give both train.{kinds} and test.{kinds}, or one {what} to split")
    if len(tables) == 1:
        return {"file": tables[0].name}, tables
    found = [p.name for p in tables] or f"no {exts} file"
    raise InitError(f"--data {rel}: expected train.{kinds} + test.{kinds}, or exactly one {what}; found {found}")


def _name(name: str | None, target: Path) -> str:
    if name is None:
        return slugify(target.name if target.is_dir() else target.stem)
    if not NAME_RE.match(name):
        raise InitError(f"--name {name!r}: use lower-case letters, digits, '-' and '_', starting with a letter "
                        f"(e.g. {slugify(name)!r})")
    return name


def _task(task: str | None, labels, label: str, ctype: str) -> tuple[str, str, bool, list[str]]:
    """(task, why, inferred, other tasks that fit) for a label column of type ``ctype`` (``Task.init_fit``)."""
    if task is not None:
        fit = _ask(task, lambda t: t.init_fit(label, labels, ctype))
        if not fit.fits:
            raise InitError(f"--task {task}: {fit.why}")
        return task, fit.why, False, []
    fits = dict(_answers(lambda t: t.init_fit(label, labels, ctype)))
    preferred = [n for n, f in fits.items() if f.fits and f.preferred]
    if not preferred:
        raise InitError(f"no task can learn label {label!r} ({ctype}): "
                        + "; ".join(f"{n}: {f.why}" for n, f in fits.items()))
    return preferred[0], fits[preferred[0]].why, True, [n for n, f in fits.items() if f.fits and n != preferred[0]]


def _check_not_inside_tracked(root: Path, target: Path) -> None:
    """Refuse data inside a folder that a .dvc file beside that folder already tracks as a whole."""
    import yaml

    for folder in target.parents:
        if folder == root or root not in folder.parents:
            return
        dvc_file = folder.parent / f"{folder.name}.dvc"
        if not dvc_file.is_file():
            continue
        try:
            outs = yaml.safe_load(dvc_file.read_text()).get("outs") or []
        except (OSError, AttributeError, yaml.YAMLError):
            continue
        if any((dvc_file.parent / str(o.get("path", ""))).resolve() == folder for o in outs):
            f, d = _rel(root, folder), _rel(root, dvc_file)
            raise InitError(
                f"{_rel(root, target)} is inside {f}/, which {d} already tracks as a whole; DVC cannot track "
                f"a part of a tracked folder on its own. Track each dataset folder with its own .dvc file "
                f"instead (`dvc remove {d}`, then `dvc add` each folder in {f}/), or put the data elsewhere")


def _dvc_add(root: Path, rel: str) -> str:
    """``dvc add`` into the local cache (no push); the new output md5."""
    import yaml

    from core.env import TELEMETRY_OFF

    done = subprocess.run([sys.executable, "-m", "dvc", "add", rel], cwd=root, env={**TELEMETRY_OFF, **os.environ},
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        out = (done.stderr.strip() or done.stdout.strip()).splitlines()
        detail = " ".join(line.strip() for line in out if line.strip())[-800:]
        if "already tracked by scm" in detail.lower():
            raise InitError(f"{rel} is committed to git; DVC tracks it instead: `git rm -r --cached {rel}`, "
                            f"commit, then run init again")
        if "overlap" in detail.lower():
            raise InitError(f"{rel} overlaps data another .dvc file tracks (DVC: {detail}); track each dataset "
                            "folder with its own .dvc file")
        raise InitError(f"dvc add {rel} failed: {detail or f'exit {done.returncode}'}")
    return yaml.safe_load((root / f"{rel}.dvc").read_text())["outs"][0]["md5"]


def _expectations_header(rel: str, md5: str) -> str:
    pct = f"{PROFILE_MARGIN:.0%}"
    return (f"# Expectations of {printable(rel)} (DVC md5 {md5}), written by `trainflow init` from a profile of "
            "the data.\n"
            f"# Review every line, then commit this file: validation checks every later version of the data\n"
            f"# against it. Profiled: each column's type, nulls (true only if seen), numeric min/max widened by\n"
            f"# {pct} of the range (a column never below 0 stays >= 0), the values of few-valued text columns and\n"
            f"# of a classification label (in the model's output order), rows per split from half to double the\n"
            f"# profiled count, and class_share: the smallest and largest share of a class in a split, +-{pct}.\n")


def _rel(root: Path, path: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)

