"""Validation of text a pretrained model fine-tunes on, against the expectations ``init --pretrained``
wrote: an empty text, an unknown label, a text past the length bounds and a test text also in train
are each refused, naming the rows; the data init profiled passes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from core.config import config_from_dict
from tasks.hf_folder import load_tokenizer
from tasks import get_task
from tasks.text_init import profile_jsonl, profile_table
from tests.hf_models import tiny_decoder, tiny_encoder
from validation.gx_run import run_plan

pytestmark = pytest.mark.integration

WORDS = "invoice refund card login crash error screen slow parcel late broken help".split()


def body(i: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(3 + i % 9)) + f" {i}"


def frame(start: int, n: int) -> pd.DataFrame:
    return pd.DataFrame({"body": [body(i) for i in range(start, start + n)],
                         "category": [("billing", "bug")[i % 2] for i in range(start, start + n)]})


def config(kind: str, expectations: str) -> object:
    files = ({"train_file": "train.csv", "test_file": "test.csv"} if kind == "csv"
             else {"text": {"train_file": "train.jsonl", "eval_file": "test.jsonl"}})
    ds = {"path": "data/t", "expectations_file": expectations, **files}
    return config_from_dict({"name": "t", "task": "text_classification" if kind == "csv" else "causal_lm",
                             "dataset": {**ds, **({"label": "category"} if kind == "csv" else {})},
                             "pretrained": {"path": "models/m", "text_column": "body"}})


def plan(cfg, root):
    """The validation plan ``trainflow run`` runs for ``cfg``: its task's."""
    return get_task(cfg.task).validation_plan(cfg, root)


def failures(report: dict) -> dict[str, str]:
    return {f"{f['split']}:{f['check']}": f["message"] for f in report["failures"]}


def test_table_text_rejected_by_its_expectations_is_named_by_row(tmp_path):
    root = tmp_path
    (root / "data" / "t").mkdir(parents=True)
    model = tiny_encoder(root / "models" / "m", [body(i) for i in range(300)])
    train, test = frame(0, 120), frame(1000, 40)
    profile = profile_table({"train": train, "test": test}, "category", load_tokenizer(model), 128, None, "t",
                            False, True)
    (root / "configs").mkdir()
    (root / "configs" / "t.expectations.yaml").write_text(profile.expectations.to_yaml())
    train.to_csv(root / "data" / "t" / "train.csv", index=False)
    test.to_csv(root / "data" / "t" / "test.csv", index=False)
    cfg = config("csv", "configs/t.expectations.yaml")
    assert run_plan(plan(cfg, root), tmp_path / "ok")["failures"] == []

    train.loc[5, "body"] = "   "
    train.loc[7, "category"] = "spam"
    train.loc[9, "body"] = " ".join(WORDS * 40)
    test.loc[3, "body"] = train.loc[11, "body"]
    train.to_csv(root / "data" / "t" / "train.csv", index=False)
    test.to_csv(root / "data" / "t" / "test.csv", index=False)
    got = failures(run_plan(plan(cfg, root), tmp_path / "bad"))
    assert "row 5 (line 7)" in got["train:empty"] and "body" in got["train:empty"]
    assert "row 7 (line 9)" in got["train:label"] and "spam" not in got["train:label"].split(":")[0]
    assert "row 9 (line 11)" in got["train:chars"] and "row 9 (line 11)" in got["train:tokens"]
    assert "train row 11 = test row 3" in got["cross:leak"]


def test_jsonl_record_that_is_not_text_is_named_by_line(tmp_path):
    root = tmp_path
    (root / "data" / "t").mkdir(parents=True)
    model = tiny_decoder(root / "models" / "m", [body(i) for i in range(300)])
    splits = {"train": [{"text": body(i)} for i in range(80)], "test": [{"text": body(i)} for i in range(500, 520)]}
    profile = profile_jsonl(splits, load_tokenizer(model), 128, "t", False, True)
    (root / "configs").mkdir()
    (root / "configs" / "t.expectations.yaml").write_text(profile.expectations.to_yaml())
    splits["train"][4] = {"text": 42}
    for name, records in splits.items():
        Path(root / "data" / "t" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    got = failures(run_plan(plan(config("jsonl", "configs/t.expectations.yaml"), root), tmp_path / "r"))
    assert "row 4 (line 5)" in got["train:format"]
    assert set(got) == {"train:format", "train:empty"}  # the unparsed record has no text either
