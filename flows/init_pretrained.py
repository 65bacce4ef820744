"""``trainflow init --pretrained models/NAME``: a Hugging Face model folder plus the user's text
into a runnable, reviewed fine-tuning pipeline.

A table (CSV/Parquet) with ``--label`` becomes ``task: text_classification``; JSON Lines (``text``,
or ``prompt`` + ``completion``) become ``task: causal_lm``. The folder is checked first
(``tasks.hf_folder.check_folder``: pickle-only weights and remote code are refused in one line,
nothing written); the text is profiled with the folder's own tokenizer (``tasks.text_init``); the
data and the folder are tracked with DVC (``models/NAME.dvc``: its md5 joins the run manifest);
``configs/NAME.yaml`` and ``configs/NAME.expectations.yaml`` are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.errors import TrainflowError
from core.printable import printable
from flows.init import (DATA_FACTS, TABLE_SUFFIXES, InitError, _checked, _dvc_add, _existing, _inside, _layout,
                        _raw_config, _rel, _write, label_columns, split_keys)

JSONL_SUFFIX = ".jsonl"


class FolderRefusedError(InitError):
    """The model folder cannot be used (pickle-only weights, remote code, links out): bad input data."""


def _kind(target: Path, label: str | None) -> str:
    """"jsonl" or "table", from the files at ``target`` (JSON Lines take no ``--label``)."""
    files = [target] if target.is_file() else [p for p in target.iterdir() if p.is_file()]
    jsonl = any(p.suffix.lower() == JSONL_SUFFIX for p in files)
    if jsonl and label is None:
        return "jsonl"
    if label is None:
        raise InitError("--label: name the column to predict (a table with a free-text column becomes "
                        "text_classification; JSON Lines become causal_lm and take no --label)")
    return "table"


def _task_defaults(task: str) -> dict:
    """The task's own ``init_defaults`` (model, gates) where this environment has the task."""
    from tasks import get_task

    try:
        return {k: v for k, v in get_task(task).init_defaults().items() if k in ("model", "gates")}
    except TrainflowError:
        return {}


def init_pretrained(root: Path, data: str | Path, pretrained: str | Path, label: str | None = None,
                    name: str | None = None, text_column: str | None = None, test_fraction: float | None = None,
                    lora: bool = False) -> dict[str, Any]:
    """Check the folder ``pretrained``, profile ``data`` with its tokenizer, ``dvc add`` both and write the
    config and the expectations. InitError (nothing written) for bad input."""
    from tasks.hf_folder import PretrainedFolderError, check_folder, load_tokenizer
    from tasks.text_init import expectations_header, profile_jsonl, profile_table, read_jsonl

    root = Path(root).resolve()
    target, rel = _inside(root, data)
    model_dir, model_rel = _inside(root, pretrained)
    if model_dir == target or target in model_dir.parents or model_dir in target.parents:
        raise InitError(f"--pretrained {model_rel} and --data {rel} overlap; keep the model folder and the data apart "
                        "(each has its own .dvc file)")
    try:
        facts = check_folder(model_dir)
        tokenizer = load_tokenizer(model_dir)
    except PretrainedFolderError as exc:
        raise FolderRefusedError(f"--pretrained {exc}") from None

    kind = _kind(target, label)
    layout, files = (_layout(target, rel, (JSONL_SUFFIX,), "JSON Lines file") if kind == "jsonl"
                     else _layout(target, rel, TABLE_SUFFIXES))
    if kind == "jsonl" and "file" in layout:
        raise InitError(f"{rel}: one JSON Lines file; causal_lm trains on one file and is gated on another: "
                        f"split it into {rel}/train.jsonl and {rel}/test.jsonl")
    dataset = split_keys(target, rel, layout, test_fraction)
    paths = dict(zip(("all",) if "file" in layout else ("train", "test"), files))
    name, config_rel, before, old = _existing(root, target, name, ".expectations.yaml")
    presplit = "train_file" in layout
    try:
        if kind == "jsonl":
            splits = {s: read_jsonl(p) for s, p in paths.items()}
            profile = profile_jsonl(splits, tokenizer, facts.max_positions, rel, lora, presplit)
        else:
            from tasks.table import read_table

            frames = {s: read_table(p) for s, p in paths.items()}
            label_columns(next(iter(frames.values())), label, _rel(root, files[0]))
            profile = profile_table(frames, label, tokenizer, facts.max_positions, text_column, rel, lora, presplit)
    except TrainflowError as exc:  # unreadable or unusable data (TextInitError): the message names where
        raise InitError(str(exc)) from None

    exp_rel = f"configs/{name}.expectations.yaml"
    if label is not None:
        dataset["label"] = label
    dataset["expectations_file"] = exp_rel
    raw = _raw_config(name, profile.task, profile.dataset_keys(dataset), {"strategy": "ddp", **profile.training},
                      {"model": {}, "gates": {}, **_task_defaults(profile.task)})
    if not raw["model"]:
        del raw["model"]
    raw["pretrained"] = {"path": model_rel, "dvc_file": f"{model_rel}.dvc", **profile.pretrained}
    if lora:
        raw["pretrained"]["lora"] = {}
    _checked(raw, "the config init would write is invalid: {}")
    if old is not None:  # a re-run: the data's and the folder's facts are new, every other key is the user's
        from core.config import merge_config

        fresh, raw = raw, merge_config(raw, old)
        raw["task"] = fresh["task"]
        raw["dataset"] = merge_config({k: v for k, v in (old.get("dataset") or {}).items() if k not in DATA_FACTS},
                                      fresh["dataset"])  # key by key: text keeps the user's holdout_fraction
        raw["pretrained"].update(path=fresh["pretrained"]["path"], dvc_file=fresh["pretrained"]["dvc_file"])
        _checked(raw, config_rel + ": the updated config is invalid: {}; fix that key in it, then run init again")

    model_md5 = _dvc_add(root, model_rel)
    lines = [f"model:        {model_rel}: {facts.model_type}, {facts.max_positions or '?'} positions, "
             f"DVC md5 {model_md5} (pretrained.path; its md5 joins the run manifest)", *profile.lines]
    why = {"text_classification": f"a table with label {label!r} and a pretrained model folder",
           "causal_lm": f"JSON Lines of {profile.shape} and a pretrained model folder"}[profile.task]
    intro = ("# Choices made from the data with the model's tokenizer (edit the keys named):\n")
    header = expectations_header(rel, "{md5}", model_rel)
    written = _write(root, target, rel, name, raw, (profile.task, why, True, intro, lines), before,
                     {exp_rel: lambda md5: profile.expectations.to_yaml(header.replace("{md5}", md5))})
    written["git_add"].insert(1, f"{model_rel}.dvc")
    gitignore = _rel(root, model_dir.parent / ".gitignore")
    if (root / gitignore).is_file() and gitignore not in written["git_add"]:
        written["git_add"].insert(2, gitignore)
    return {**written, "task_reason": why, "rows": profile.splits, "lines": lines, "expectations": exp_rel,
            "model_dvc_file": f"{model_rel}.dvc", "model_md5": model_md5}


def format_pretrained_report(r: dict[str, Any]) -> str:
    """What ``trainflow init --pretrained`` prints."""
    rows = ", ".join(f"{k} {v}" for k, v in r["rows"].items())
    lines = [f"data:         {r['data']} ({rows} rows)", f"task:         {r['task']} ({r['task_reason']})",
             f"name:         {r['name']}", *r["lines"],
             f"dvc add:      {r['dvc_file']} (md5 {r['md5']}) and {r['model_dvc_file']} (md5 {r['model_md5']}), "
             "in the local DVC cache",
             f"expectations: {r['expectations']}  <- review it: validation checks every data version against it",
             f"config:       {r['config']}"]
    lines = [printable(line) for line in lines]
    if r.get("updated"):
        lines += ["", f"Updated {' and '.join(r['updated'])}. What changed:"]
        for path, diff in r["diff"].items():
            lines += [diff.rstrip("\n")] if diff else [f"    {path}: unchanged"]
    lines += ["", "The data and the model folder are in this repository's local DVC cache only; add your own",
              "DVC remote and `dvc push` to share them.", "", "Commit:",
              printable(f"    git add {' '.join(r['git_add'])}"), f"    git commit -m 'trainflow init: {r['name']}'",
              "Next:", f"    {r['next']}"]
    return "\n".join(lines)
