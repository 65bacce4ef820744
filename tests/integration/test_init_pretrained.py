"""``trainflow init --pretrained`` on real git + DVC projects with tiny model folders built in the
test: a ticket table becomes text_classification, JSON Lines become causal_lm, both folders tracked
by DVC; a pickle-only folder and a remote-code config are refused in one line, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from core.config import load_config
from core.text_expectations import load_text_expectations
from tests.hf_models import pickle_only, remote_code, tiny_decoder, tiny_encoder
from tests.integration.test_init import cli, project, template  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

WORDS = ("invoice charge refund card login password crash error screen slow app update account email "
         "delivery late parcel address broken missing thanks please help urgent again today").split()
CATEGORIES = ("billing", "bug", "shipping")


def tickets(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    text = [" ".join(rng.choice(WORDS, int(rng.integers(3, 30)))) for _ in range(n)]
    return pd.DataFrame({"id": [f"T{seed}-{i}" for i in range(n)], "channel": rng.choice(["mail", "web"], n),
                         "body": text, "category": rng.choice(CATEGORIES, n)})


def chats(n: int, seed: int, pairs: bool) -> list[dict]:
    rng = np.random.default_rng(seed)
    say = lambda k: " ".join(rng.choice(WORDS, int(rng.integers(2, k))))  # noqa: E731
    return [{"prompt": say(10), "completion": say(20)} if pairs else {"text": say(40)} for _ in range(n)]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Tiny encoder / decoder folders, built once; each test copies what it needs into its project."""
    base = tmp_path_factory.mktemp("hf")
    texts = [" ".join(WORDS[i % len(WORDS):] + WORDS[:i % 7]) for i in range(200)]
    return {"encoder": tiny_encoder(base / "enc", texts, positions=64),
            "decoder": tiny_decoder(base / "dec", texts, positions=64)}


def copy_folder(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_ticket_table_becomes_text_classification_with_tracked_model(project, folders, monkeypatch, capsys):
    (project / "data" / "tickets").mkdir()
    tickets(300, 0).to_csv(project / "data" / "tickets" / "train.csv", index=False)
    tickets(100, 1).to_csv(project / "data" / "tickets" / "test.csv", index=False)
    encoder = copy_folder(folders["encoder"], project / "models" / "my-encoder")
    (encoder / "1_Pooling").mkdir()  # a sentence-transformers encoder trained with mean pooling
    (encoder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    pooling = {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    (encoder / "modules.json").write_text(json.dumps([pooling]))
    assert cli(project, monkeypatch, "--data", "data/tickets", "--label", "category",
               "--pretrained", "models/my-encoder") == 0
    out = capsys.readouterr().out
    cfg = load_config(project / "configs" / "tickets.yaml")
    assert cfg.task == "text_classification"
    assert cfg.pretrained.path == "models/my-encoder" and cfg.pretrained.text_column == "body"
    assert 8 <= cfg.pretrained.max_length <= 64
    assert 1 <= cfg.training.epochs <= 5 and 2e-5 <= cfg.training.lr <= 5e-5
    assert cfg.pretrained.pooling == "mean" and cfg.training.early_stopping.patience == 2
    assert "model" not in yaml.safe_load((project / "configs" / "tickets.yaml").read_text())  # the folder's network
    for said in ("pooling:      mean: the mean of the text's token states",
                 "text:         body: the longest text", "tokens:       p50", "max_length:", "row(s) longer are "
                 "truncated", "classes:      3", "lr:", "warmup:", "models/my-encoder.dvc"):
        assert said in out, said
    exp = load_text_expectations(project / "configs" / "tickets.expectations.yaml")
    assert exp.columns == ["body"] and exp.labels == sorted(CATEGORIES) and exp.no_leak
    assert exp.tokens["body"][0] >= 1 and exp.chars["body"][1] > exp.chars["body"][0]
    dvc = yaml.safe_load((project / "models" / "my-encoder.dvc").read_text())
    assert dvc["outs"][0]["md5"].endswith(".dir") and dvc["outs"][0]["path"] == "my-encoder"
    assert (project / "data" / "tickets.dvc").is_file()


@pytest.mark.parametrize("pairs", [False, True], ids=["text", "prompt-completion"])
def test_jsonl_becomes_causal_lm(project, folders, monkeypatch, capsys, pairs):
    (project / "data" / "chats").mkdir()
    write_jsonl(project / "data" / "chats" / "train.jsonl", chats(200, 0, pairs))
    write_jsonl(project / "data" / "chats" / "test.jsonl", chats(50, 1, pairs))
    copy_folder(folders["decoder"], project / "models" / "my-decoder")
    if not pairs:  # init run again over a config the user edited: keys init does not decide stay, text's too
        (project / "configs").mkdir()
        (project / "configs" / "chats.yaml").write_text(yaml.safe_dump({"dataset": {"text": {
            "train_file": "old.jsonl", "holdout_fraction": 0.25}}}))
    assert cli(project, monkeypatch, "--data", "data/chats", "--pretrained", "models/my-decoder") == 0
    out = capsys.readouterr().out
    cfg = load_config(project / "configs" / "chats.yaml")
    assert cfg.task == "causal_lm" and cfg.pretrained.path == "models/my-decoder"
    assert (cfg.dataset.text.train_file, cfg.dataset.text.eval_file) == ("train.jsonl", "test.jsonl")
    assert cfg.dataset.text.holdout_fraction == (0.1 if pairs else 0.25)
    assert (cfg.pretrained.prompt_column, cfg.pretrained.completion_column) == (
        ("prompt", "completion") if pairs else (None, None))
    assert cfg.training.lr == 2e-5 and "records:      " in out
    exp = load_text_expectations(project / "configs" / "chats.expectations.yaml")
    assert exp.format == "jsonl" and exp.columns == (["prompt", "completion"] if pairs else ["text"])
    assert (project / "models" / "my-decoder.dvc").is_file()


@pytest.mark.parametrize("bad", ["pickle", "remote"])
def test_unsafe_folder_is_refused_in_one_line_with_nothing_written(project, monkeypatch, capsys, bad):
    (project / "data" / "tickets").mkdir()
    tickets(60, 0).to_csv(project / "data" / "tickets" / "all.csv", index=False)
    folder = project / "models" / "evil"
    pickle_only(folder) if bad == "pickle" else remote_code(folder, WORDS * 10)
    assert cli(project, monkeypatch, "--data", "data/tickets", "--label", "category",
               "--pretrained", "models/evil") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert ("only pickle weights" if bad == "pickle" else "config.json asks for remote code") in err
    assert not (project / "configs").exists() and not (project / "models" / "evil.dvc").exists()
    assert not (project / "data" / "tickets.dvc").exists()


def test_a_rerun_keeps_the_users_keys_and_shows_the_diff(project, folders, monkeypatch, capsys):
    (project / "data" / "tickets").mkdir()
    tickets(200, 0).to_csv(project / "data" / "tickets" / "all.csv", index=False)
    copy_folder(folders["encoder"], project / "models" / "enc")
    args = ("--data", "data/tickets", "--label", "category", "--pretrained", "models/enc")
    assert cli(project, monkeypatch, *args) == 0
    path = project / "configs" / "tickets.yaml"
    path.write_text(path.read_text().replace("lr: 5.0e-05", "lr: 4.0e-05"))
    tickets(400, 3).to_csv(project / "data" / "tickets" / "all.csv", index=False)
    capsys.readouterr()
    assert cli(project, monkeypatch, *args) == 0
    out = capsys.readouterr().out
    cfg = load_config(path)
    assert cfg.training.lr == 4e-5 and cfg.dataset.file == "all.csv"
    assert "Updated configs/tickets.yaml and configs/tickets.expectations.yaml" in out
    assert "-  train: [100, 400]\n+  train: [200, 800]" in out  # the expectations' diff: twice the rows


def test_free_text_column_of_a_plain_table_is_left_out_and_said(project, monkeypatch, capsys):
    (project / "data" / "tickets").mkdir()
    df = tickets(200, 0).drop(columns="id")
    df.loc[[3, 4], "body"] = "call me back today please"  # repeated: not an identifier
    df.to_csv(project / "data" / "tickets" / "all.csv", index=False)
    assert cli(project, monkeypatch, "--data", "data/tickets", "--label", "category") == 0
    out = capsys.readouterr().out
    cfg = load_config(project / "configs" / "tickets.yaml")
    assert cfg.task == "classification" and cfg.dataset.exclude == ["body"] and "body" not in cfg.dataset.categorical
    assert "excluded:     body: free text (" in out and "init --pretrained" in out
