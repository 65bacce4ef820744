"""The causal_lm task's data, loss and LoRA on a tiny GPT-2-like folder built here (no download)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from core.config import config_from_dict
from core.errors import ConfigError, DataUnavailableError
from tasks import get_task
from tasks.causal_lm_data import IGNORE, pack_text, read_records, record_targets
from tasks.hf_folder import load_model, load_tokenizer
from tests.causal_data import write_project


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("causal")
    return root, write_project(root, "pairs", n_train=60, n_eval=10)


@pytest.fixture(scope="module")
def tok(project):
    return load_tokenizer(project[0] / "models" / "tiny-gpt")


def _cfg(raw, **pretrained):
    return config_from_dict({**raw, "pretrained": {**raw["pretrained"], **pretrained}})


def test_text_is_packed_into_full_sequences_with_eos_between_documents(tok):
    docs = [("the apple is red.",), ("the lime is green.",), ("the plum is purple.",)]
    x, y = pack_text(tok, docs, 8)
    eos = tok.eos_token_id
    stream = [t for (d,) in docs for t in tok(d)["input_ids"] + [eos]]
    assert (x[:-1, 1] == 1).all()  # every sequence but the tail is full
    # Inputs then targets shifted by one, across document boundaries; the tail's padding is not learned.
    n = int(x[-1, 1].sum())
    assert list(np.concatenate([x[:-1, 0].ravel(), x[-1, 0, :n]])) == stream[:-1]
    assert list(np.concatenate([y[:-1].ravel(), y[-1, :n]])) == stream[1:]
    assert (y[-1, n:] == IGNORE).all() and stream.count(eos) == 3


def test_a_text_corpus_loads_as_its_documents_packed_into_full_windows(project, tok, tmp_path, monkeypatch):
    from tasks.text import holdout_documents

    root, _ = project
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    raw = write_project(root, "text", n_train=30, n_eval=6, folder="chat-text")  # beside the pairs: same model
    splits = get_task("causal_lm").load_data(config_from_dict(raw), root, 0)
    assert not splits.info.pairs and splits.info.max_length == 32
    data = root / "data" / "chat-text"
    train, test = (read_records(data / name, ("text",)) for name in ("train.jsonl", "val.jsonl"))
    keep, hold = holdout_documents(len(train), 0.1, 0)
    assert len(hold) == 3
    for split, docs in ((splits.train, [train[i] for i in keep]), (splits.val, [train[i] for i in hold]),
                        (splits.test, test)):
        x, y = (t.numpy() for t in split.tensors)
        want = pack_text(tok, docs, 32)
        assert np.array_equal(x, want[0]) and np.array_equal(y, want[1])
        assert len(x) > 1 and (x[:-1, 1] == 1).all()  # several documents to a window, every window full


def test_a_batchs_tokens_are_its_sequences_own_padding_left_out():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [0, 0, 0, 0]])
    mask = (ids != 0).long()
    assert int(get_task("causal_lm").batch_tokens(torch.stack([ids, mask], 1))) == 5
    assert get_task("lm").batch_tokens(torch.zeros(4, 16, dtype=torch.long)) == 64  # windows of bytes, none padded
    assert get_task("classification").batch_tokens(torch.ones(4, 3)) is None  # a table's inputs are not tokens


def test_a_pair_learns_its_completion_and_eos_only(tok):
    prompt, completion = "q1: what colour is the lime?", " the lime is green."
    [(inputs, targets)] = record_targets(tok, (prompt, completion), 64)
    p, c = tok(prompt)["input_ids"], tok(completion, add_special_tokens=False)["input_ids"]
    assert inputs == p + c and targets[:len(p) - 1] == [IGNORE] * (len(p) - 1)
    assert targets[len(p) - 1:] == c + [tok.eos_token_id]
    assert record_targets(tok, (prompt, completion), len(p) - 1) == []  # the prompt fills the window


def test_the_loss_is_the_completions_alone(project, tok):
    root, raw = project
    cfg = _cfg(raw)
    task = get_task("causal_lm")
    splits = task.load_data(cfg, root, 0)
    x, y = (t[:4] for t in splits.train.tensors)
    model = task.build_model(cfg, splits.info).eval()
    with torch.no_grad():
        logits = model(x)
    base = task.loss(logits, y, "sum")
    prompt = (y[:, :logits.shape[1]] == IGNORE) & (x[:, 1, :logits.shape[1]] == 1)
    assert prompt.any() and (~prompt & (y[:, :logits.shape[1]] != IGNORE)).any()
    # Another prediction at every prompt position: the same loss.
    noisy = logits.clone()
    noisy[prompt] = torch.randn_like(noisy[prompt]) * 10
    assert torch.equal(task.loss(noisy, y, "sum"), base)
    # One completion position's prediction changed: another loss.
    i, j = [int(v[0]) for v in torch.nonzero(y[:, :logits.shape[1]] != IGNORE, as_tuple=True)]
    noisy = logits.clone()
    noisy[i, j] = torch.randn_like(noisy[i, j]) * 10
    assert not torch.equal(task.loss(noisy, y, "sum"), base)
    # Dynamic padding: the batch runs as long as its longest sequence, and an empty batch still runs.
    assert logits.shape[1] == int(x[:, 1].sum(1).max()) < cfg.pretrained.max_length
    assert model(x[:0]).shape[0] == 0


def test_lora_trains_only_adapters_and_exports_base_plus_delta(project, tmp_path):
    root, raw = project
    cfg = _cfg(raw, lora={"r": 2, "alpha": 4, "dropout": 0.0}, activation_checkpointing=True)
    task = get_task("causal_lm")
    splits = task.load_data(cfg, root, 0)
    torch.manual_seed(0)
    model = task.build_model(cfg, splits.info)
    assert model.hf.get_base_model().is_activation_checkpointing
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert 0 < trainable < 0.05 * total
    base = {k: v.clone() for k, v in load_model(splits.info.folder, "causal_lm").state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = splits.train.tensors
    for s in range(3):
        task.loss(model(x[s * 8:(s + 1) * 8]), y[s * 8:(s + 1) * 8], "sum").backward()
        opt.step()
        opt.zero_grad()
    # The base weights did not move; the adapters did.
    named = dict(model.hf.named_parameters())
    for key, value in base.items():
        peft_key = next((k for k in named if k.endswith(key.replace(".weight", ".base_layer.weight"))
                         or k.endswith(key)), None)
        if peft_key is not None:
            assert torch.equal(named[peft_key].detach(), value), key
    lora_b = [v for k, v in named.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)
    # The exported folder: plain transformers weights (no adapters), equal to base + (alpha / r) * B @ A.
    task.export_files(cfg, model, splits.info, tmp_path)
    exported = load_model(tmp_path / "hf_model", "causal_lm").state_dict()
    assert set(exported) == set(base) and not any("lora" in k for k in exported)
    layer = model.hf.base_model.model.transformer.h[0].attn.c_attn
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight).T * (4 / 2)  # Conv1D: [in, out]
    assert torch.allclose(exported["transformer.h.0.attn.c_attn.weight"],
                          base["transformer.h.0.attn.c_attn.weight"] + delta, atol=1e-6)
    assert torch.equal(exported["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"])


def test_config_and_records_that_do_not_fit_are_named(project, tmp_path):
    root, raw = project
    with pytest.raises(ConfigError, match="pretrained.prompt_column: set both"):
        get_task("causal_lm").check_config(_cfg(raw, completion_column=None))
    with pytest.raises(ConfigError, match=r"^pretrained.pooling: mean is what a text_classification head reads"):
        get_task("causal_lm").check_config(_cfg(raw, pooling="mean"))
    with pytest.raises(ConfigError, match="pretrained: required"):
        get_task("causal_lm").check_config(config_from_dict({k: v for k, v in raw.items() if k != "pretrained"}))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "p", "completion": "c"}) + "\n" + json.dumps({"prompt": "p"}) + "\n")
    with pytest.raises(DataUnavailableError, match=r"bad.jsonl:2: not a JSON object with string 'prompt', 'completion'"):
        read_records(bad, ("prompt", "completion"))


def test_tokenized_splits_are_cached_per_data_and_tokenizer_without_pickle(project, tmp_path, monkeypatch):
    from tasks.causal_lm_data import tokenized

    root, raw = project
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    cfg, folder = _cfg(raw), root / "models" / "tiny-gpt"
    first = tokenized(cfg, root, 0, folder)
    [cached] = (tmp_path / "home" / "cache" / "causal_lm").glob("*.npz")
    with np.load(cached, allow_pickle=False) as arrays:
        assert sorted(arrays.files) == sorted(first)
    again = tokenized(cfg, root, 0, folder)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    tokenized(_cfg(raw, max_length=16), root, 0, folder)  # another setting: another entry
    assert len(list(cached.parent.glob("*.npz"))) == 2
