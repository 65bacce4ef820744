"""The stdlib text dataset: export determinism, byte windows, text config, LM gates, scoring windows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.config import DatasetConfig, load_config
from core.errors import ConfigError, DataUnavailableError
from tasks.lm_eval import summarise
from tasks.pyfunc_common import score_documents, windows
from tasks import task_for
from tests.conftest import load_script
from tasks.text import cut_windows, holdout_documents, load_text_splits, read_documents, window_starts

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    return load_script(name)


@pytest.fixture
def fake_stdlib(tmp_path) -> Path:
    lib = tmp_path / "lib"
    (lib / "tests").mkdir(parents=True)
    for i in range(40):
        (lib / f"mod{i:02d}.py").write_text(f"# module {i}\n" + "x = 1\n" * (400 + 37 * i))
    (lib / "tiny.py").write_text("pass\n")  # under MIN_BYTES
    (lib / "huge.py").write_text("y = 2\n" * 5000)  # over MAX_BYTES
    (lib / "_private.py").write_text("z = 3\n" * 500)
    (lib / "latin.py").write_bytes(b"# caf\xe9\n" + b"w = 4\n" * 500)  # not UTF-8
    (lib / "tests" / "test_x.py").write_text("t = 5\n" * 500)  # a sub-package
    return lib


# -- export -------------------------------------------------------------------------------
def test_export_is_byte_stable_and_follows_the_selection_rule(fake_stdlib, tmp_path):
    ex = _script("export_stdlib")
    a = ex.export(tmp_path / "a", fake_stdlib)
    b = ex.export(tmp_path / "b", fake_stdlib)
    for key in ("train", "val", "manifest"):
        assert a[key].read_bytes() == b[key].read_bytes(), key
    docs = {s: [json.loads(line) for line in a[s].read_text().splitlines()] for s in ("train", "val")}
    paths = [d["path"] for s in docs.values() for d in s]
    assert sorted(paths) == [f"mod{i:02d}.py" for i in range(40)]  # the rule drops the other five
    for split in ("train", "val"):
        assert [d["path"] for d in docs[split]] == sorted(d["path"] for d in docs[split])
        assert all(ex.split_of(d["path"]) == split for d in docs[split])
    assert docs["val"] and docs["train"]
    assert (fake_stdlib / "mod03.py").read_text() == next(d["text"] for s in docs.values() for d in s
                                                         if d["path"] == "mod03.py")
    manifest = json.loads(a["manifest"].read_text())
    assert manifest["python"] == ex.python_version()
    assert manifest["documents"] == {"train": len(docs["train"]), "val": len(docs["val"])}


def test_split_depends_on_the_path_only(fake_stdlib, tmp_path):
    ex = _script("export_stdlib")
    before = ex.export(tmp_path / "a", fake_stdlib)
    (fake_stdlib / "mod07.py").unlink()
    after = ex.export(tmp_path / "b", fake_stdlib)
    old = {json.loads(x)["path"]: s for s in ("train", "val") for x in before[s].read_text().splitlines()}
    new = {json.loads(x)["path"]: s for s in ("train", "val") for x in after[s].read_text().splitlines()}
    assert "mod07.py" not in new
    assert all(old[p] == s for p, s in new.items())


def test_check_explains_a_python_version_mismatch(tmp_path, monkeypatch, capsys):
    ex = _script("export_stdlib")
    monkeypatch.setattr(ex, "ROOT", tmp_path)
    (tmp_path / ex.DVC_FILE).write_text("outs:\n- md5: 0123.dir\n  path: data-stdlib\n")
    (tmp_path / ex.FOLDER).mkdir()
    (tmp_path / ex.FOLDER / "manifest.json").write_text(json.dumps({"python": "CPython 2.7.18"}))
    assert ex.main(["--check"]) == 2
    err = capsys.readouterr().err
    assert "CPython 2.7.18" in err and ex.python_version() in err and "differs between Python versions" in err


# -- windows ------------------------------------------------------------------------------
def test_window_starts_cover_the_tail_and_skip_short_documents():
    assert window_starts(9, 8, 8) == [0]  # exactly one window needs seq_len + 1 bytes
    assert window_starts(8, 8, 8) == []
    assert window_starts(20, 8, 8) == [0, 8, 11]  # the last window ends at the last byte
    assert window_starts(25, 8, 8) == [0, 8, 16]
    assert window_starts(25, 8, 4) == [0, 4, 8, 12, 16]


def test_cut_windows_gives_next_byte_targets():
    doc = bytes(range(30))
    x, y = cut_windows([doc, b"short"], seq_len=8, stride=8)
    assert x.dtype == np.int64 and x.shape == (4, 8) == y.shape
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    np.testing.assert_array_equal(x[0], np.arange(8))
    np.testing.assert_array_equal(y[-1], np.arange(22, 30))  # tail window ends at the last byte


def _corpus(tmp_path: Path, train: list[str], val: list[str]) -> DatasetConfig:
    base = tmp_path / "corpus"
    base.mkdir()
    for name, docs in (("train.jsonl", train), ("val.jsonl", val)):
        (base / name).write_text("".join(json.dumps({"path": f"d{i}.py", "text": t}) + "\n" for i, t in enumerate(docs)))
    return DatasetConfig(path="corpus", text={"seq_len": 8, "holdout_fraction": 0.25})


def test_text_splits_hold_out_whole_train_documents_and_test_on_the_eval_file(tmp_path):
    train = [chr(ord("a") + i) * 40 for i in range(8)]  # each document one distinct letter
    cfg = _corpus(tmp_path, train, ["é" * 20])
    s = load_text_splits(cfg, tmp_path, seed=0)
    letters = {k: set(np.unique(getattr(s, k).tensors[0].numpy()).tolist()) for k in ("train", "val", "test")}
    assert len(letters["val"]) == 2 and len(letters["train"]) == 6  # ceil(8 * 0.25) documents held out
    assert not letters["val"] & letters["train"]
    assert letters["test"] == set("é".encode())  # UTF-8 bytes, not code points
    assert s.train.tensors[0].dtype == torch.int64 and s.train.tensors[0].shape[1] == 8
    again = load_text_splits(cfg, tmp_path, seed=0)
    assert torch.equal(again.val.tensors[0], s.val.tensors[0])


def test_holdout_keeps_at_least_one_training_document():
    keep, hold = holdout_documents(1, 0.5, seed=3)
    assert len(keep) == 1 and len(hold) == 0


def test_missing_corpus_and_malformed_lines_are_data_errors(tmp_path):
    with pytest.raises(DataUnavailableError, match="dvc pull"):
        read_documents(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"path": "a.py", "text": "ok"}\n{"path": "b.py"}\n')
    with pytest.raises(DataUnavailableError, match=r"bad.jsonl:2"):
        read_documents(bad)


# -- config -------------------------------------------------------------------------------
def test_digits_config_id_is_unchanged_by_keys_added_later():
    cfg = load_config(ROOT / "configs" / "digits.yaml")
    same = load_config(ROOT / "configs" / "digits.yaml", ["model.factory=null", "model.kwargs={}"])
    assert same.config_id() == cfg.config_id()
    # ... but setting one of the new keys is a different config.
    assert load_config(ROOT / "configs" / "digits.yaml", ["model.kwargs={a: 1}"]).config_id() != cfg.config_id()


def test_text_config_errors_name_the_key_path():
    lm = ROOT / "configs" / "stdlib-lm.yaml"

    def check(overrides):
        task_for(load_config(lm, overrides))

    with pytest.raises(ConfigError, match=r"dataset\.text\.seq_len: 32 differs from model\.seq_len 64"):
        check(["dataset.text.seq_len=32"])
    with pytest.raises(ConfigError, match=r"model\.kind: the lm task needs 'lm'"):
        check(["model.kind=cnn", "training.strategy=ddp"])
    with pytest.raises(ConfigError, match=r"gates\.thresholds\.perplexity: required"):
        check(["gates.thresholds={latency_p95_ms: 5}"])
    with pytest.raises(ConfigError, match=r"dataset\.text\.expectations\.doc_bytes: lower bound 9 is above"):
        load_config(lm, ["dataset.text.expectations.doc_bytes=[9, 2]"])
    with pytest.raises(ConfigError, match=r"dataset\.text: required for the lm task"):
        task_for(load_config(ROOT / "configs" / "digits.yaml",
                             ["task=lm", "model.kind=lm", "gates.thresholds={perplexity: 5}", "gates.baseline_margin=null"]))
    with pytest.raises(ConfigError, match=r"dataset\.text: only for the lm task"):
        task_for(load_config(lm, ["task=classification", "model.kind=mlp", "training.strategy=ddp",
                                  "dataset.expectations_file=x.yaml", "gates.thresholds={}"]))


# -- scoring windows ----------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 5, 9, 16, 17, 23, 40])
def test_scoring_windows_score_every_target_exactly_once(n):
    doc = bytes((7 * i) % 256 for i in range(n))
    x, y, mask = windows(doc, 8)
    assert mask.sum() == max(n - 1, 0)
    scored = sorted(int(t) for xs, ys, ms in zip(x, y, mask) for t in ys[ms])
    assert scored == sorted(doc[1:])
    np.testing.assert_array_equal(x[:, 1:][mask[:, 1:]], y[:, :-1][mask[:, 1:]])


class _Bigram(torch.nn.Module):
    """Logits depend only on the current byte: the scoring must not depend on the windowing."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(256, 256, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return self.table[x]


def test_document_scores_match_a_direct_computation():
    model = _Bigram()
    docs = [b"hello world, hello bytes", b"ab", b"", "caf\u00e9 " .encode() * 9]
    loss, n = score_documents(model, docs, seq_len=8)
    for d, l_, k in zip(docs, loss, n):
        t = torch.tensor(list(d), dtype=torch.long)
        assert k == max(len(d) - 1, 0)
        if k:
            direct = torch.nn.functional.cross_entropy(model.table[t[:-1]], t[1:], reduction="sum")
            assert l_ == pytest.approx(float(direct.detach()), rel=1e-5)
    s = summarise(loss, n)
    assert s["perplexity"] == pytest.approx(math.exp(s["loss"])) and s["n_tokens"] == int(n.sum())
    assert s["bits_per_byte"] == pytest.approx(s["loss"] / math.log(2))


def test_each_task_hands_its_evaluator_loaded_model_and_accuracy():
    """The rooms ask the task, not a flag: the lm task scores documents with its own evaluator and is
    loaded as a text scorer; a table uses the per-row evaluator and the plain predictor; a regression
    reports no accuracy."""
    from tasks import get_task, lm_eval
    from tasks.base import Predictor

    lm, reg, cls = get_task("lm"), get_task("regression"), get_task("classification")
    assert lm.evaluator() is lm_eval and lm.loaded_model() is lm_eval.TextScorer
    assert reg.evaluator() is None and reg.loaded_model() is Predictor
    assert reg.val_accuracy(3.0, 4) is None and cls.val_accuracy(3.0, 4) == 0.75
