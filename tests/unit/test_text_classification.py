"""The text_classification task's parts, in process: packing and dynamic padding, the tokenized
cache keyed by the tokenizer's files, FSDP's units, the TF-IDF baseline and its gate."""

from __future__ import annotations

import numpy as np
import pytest

from tests.hf_models import tiny_encoder
from tests.text_data import tickets


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "enc", tickets(200)["text"])


def test_pack_holds_each_rows_count_then_its_ids_padded():
    from tasks.text_classification import pack

    x = pack([[2, 7, 3], [2, 3], list(range(10))], 4, 0)
    assert x.tolist() == [[3, 2, 7, 3, 0], [2, 2, 3, 0, 0], [4, 0, 1, 2, 3]]


def test_a_batchs_tokens_are_its_rows_own_padding_left_out():
    import torch

    from tasks import get_task
    from tasks.text_classification import pack

    x = torch.from_numpy(pack([[2, 7, 3], [2, 3], list(range(10))], 4, 0))  # the last cut to 4
    assert int(get_task("text_classification").batch_tokens(x)) == 3 + 2 + 4


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_a_batch_is_cut_to_its_longest_row_and_padding_changes_no_logit(encoder, pooling):
    import torch

    from tasks.text_classification import backend_tokenizer, pack, text_network

    backend, pad = backend_tokenizer(encoder, 64)
    texts = ["refund please", "the app crash after update again and again"]
    x = torch.from_numpy(pack([e.ids for e in backend.encode_batch(texts)], 64, pad))
    net = text_network(encoder, ["a", "b"], pad, pooling=pooling).eval()
    seen = []
    hook = net.model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["input_ids"].shape[1]),
                                               with_kwargs=True)
    with torch.no_grad():
        both = net(x)
        alone = net(x[:1])
    hook.remove()
    longest = int(x[:, 0].max())
    assert seen == [longest, int(x[0, 0])]  # each batch padded to its own longest row, not to 64
    torch.testing.assert_close(both[:1], alone, atol=1e-5, rtol=1e-5)
    empty = net.train()(x[:0])  # an epoch's empty last micro-batch still reaches every parameter
    assert empty.shape == (0, 2)
    empty.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters() if p.requires_grad)
    net.eval().trim = False  # the exported form: packed as given, two pad columns more
    with torch.no_grad():
        torch.testing.assert_close(net(x), both, atol=1e-5, rtol=1e-5)


def test_tokenizer_files_key_the_cache_and_weights_do_not(encoder, tmp_path):
    import shutil

    from tasks.text_classification import tokenizer_sha256

    copy = tmp_path / "copy"
    shutil.copytree(encoder, copy)
    assert tokenizer_sha256(copy) == tokenizer_sha256(encoder)
    (copy / "model.safetensors").write_bytes(b"other weights")
    assert tokenizer_sha256(copy) == tokenizer_sha256(encoder)
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text().replace("refund", "refunds"))
    assert tokenizer_sha256(copy) != tokenizer_sha256(encoder)


def test_fsdp_shards_each_transformer_block(encoder):
    from tasks import get_task
    from tasks.text_classification import text_network

    net = text_network(encoder, ["a", "b", "c"], 0)
    units = get_task("text_classification").fsdp_units(net)
    assert len(units) == 2 and all(type(u).__name__ == "BertLayer" for u in units)
    assert get_task("classification").fsdp_units(net) is None  # a table's model: the engine's default units


def test_tfidf_baseline_learns_the_words_and_is_cached(tmp_path):
    from tasks.text_classification import fit_tfidf

    train, test = tickets(300, seed=1), tickets(100, seed=2)
    classes = sorted(set(train["category"]))
    y = np.array([classes.index(c) for c in train["category"]])

    def arrays():
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(max_iter=1000), train["text"].to_numpy(), y, test["text"].to_numpy()

    first = fit_tfidf(tmp_path, {"k": 1}, arrays, 0, 10_000)
    truth = np.array([classes.index(c) for c in test["category"]])
    assert not first["cached"] and np.mean(first["pred"] == truth) > 0.8
    np.testing.assert_allclose(first["proba"].sum(axis=1), 1.0)
    assert "TF-IDF" in first["predictor"] and first["fit_s"] > 0
    again = fit_tfidf(tmp_path, {"k": 1}, lambda: pytest.fail("refitted"), 0, 10_000)
    assert again["cached"] and again["pred"].tolist() == first["pred"].tolist()


def test_max_gap_to_baseline_fails_a_candidate_that_trails_the_baseline_model():
    from core.config import GatesConfig
    from evaluation.gates import decide
    from tasks import get_task

    task = get_task("text_classification")
    cand, ref = {"accuracy": 0.80, "macro_f1": 0.8}, {"accuracy": 0.90, "predictor": "TF-IDF"}
    d = decide(task, cand, GatesConfig(max_gap_to_baseline=0.05), gbdt=ref)
    assert not d.passed and d.failures[0].name == "accuracy_vs_baseline_model"
    assert d.failures[0].threshold == pytest.approx(0.85)
    assert decide(task, cand, GatesConfig(max_gap_to_baseline=0.2), gbdt=ref).passed
    assert decide(task, cand, GatesConfig(), gbdt=ref).passed  # null: reported, not gated
    from evaluation.report import gate_markdown

    md = gate_markdown(task, d, cand, None, gbdt={**ref, "fit_s": 1.0})  # named by the task, not as trees
    assert "TF-IDF + logistic regression (TF-IDF): accuracy 0.9000, the candidate 0.8000 (-0.1000 worse)" in md
    assert "trees" not in md


def test_activation_checkpointing_recomputes_blocks_with_the_same_gradients(encoder):
    import torch

    from tasks.text_classification import backend_tokenizer, pack, text_network

    backend, pad = backend_tokenizer(encoder, 32)
    x = torch.from_numpy(pack([e.ids for e in backend.encode_batch(["refund my card", "crash error again"])], 32, pad))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        net = text_network(encoder, ["a", "b"], pad, activation_checkpointing=checkpointing).train()
        assert net.model.is_activation_checkpointing == checkpointing
        torch.manual_seed(1)  # the same dropout masks: the recomputation replays the saved RNG state
        net(x).sum().backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in net.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1])


def test_on_a_first_run_each_rank_tokenizes_only_its_share_and_reads_the_rest(tmp_path):
    import threading

    from tasks.text_classification import tokenize_share

    texts = [f"text {i}" for i in range(10)]
    whole = np.arange(10)[:, None].repeat(3, axis=1)
    both_wrote = threading.Barrier(2, timeout=60)
    encoded, answers = {0: [], 1: []}, {}

    def rank(r: int) -> None:
        def encode(part):
            encoded[r].extend(part)
            return whole[[texts.index(t) for t in part]]

        def part(start, stop):
            if start // 5 != r:  # another rank's chunk: read only once both ranks wrote their own
                both_wrote.wait()
            return tmp_path / f"{start}-{stop}.npy"

        answers[r] = tokenize_share(texts, encode, part, r, 2)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert encoded == {0: texts[:5], 1: texts[5:]}  # each its own half, never the other's
    assert answers[0].tolist() == answers[1].tolist() == whole.tolist()
    # Alone (its peer's part missing, or another world size) a rank tokenizes what it cannot read.
    alone = []
    got = tokenize_share(texts, lambda p: alone.extend(p) or whole[[texts.index(t) for t in p]],
                         lambda a, b: tmp_path / "alone" / f"{a}-{b}.npy", 1, 3)
    assert got.tolist() == whole.tolist() and sorted(alone) == sorted(texts)


def test_the_tokenized_parts_go_once_the_whole_cache_is_in_place(encoder, tmp_path, monkeypatch):
    import shutil

    from core.config import config_from_dict
    from tasks.text_classification import TextClassification

    shutil.copytree(encoder, tmp_path / "models" / "enc")
    (tmp_path / "data").mkdir()
    tickets(40, seed=1).to_csv(tmp_path / "data" / "train.csv", index=False)
    tickets(20, seed=2).to_csv(tmp_path / "data" / "test.csv", index=False)
    cfg = config_from_dict({"name": "t", "task": "text_classification", "dataset": {
        "path": "data", "dvc_file": "data.dvc", "label": "category"}, "pretrained": {"path": "models/enc"}})
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    cache = tmp_path / "home" / "cache" / "text"
    monkeypatch.setenv("WORLD_SIZE", "2")  # rank 0 of 2 writes the whole cache; its peer may still read the parts
    monkeypatch.setenv("RANK", "0")
    first = TextClassification().prepared(cfg, tmp_path)
    assert len(list(cache.glob("*.npz"))) == 1 and list((cache / "parts").glob("*/*.npy"))
    # The next read of the whole cache (the flow's evaluation, or a crash between the two writes and the
    # removal) removes them; the answer is the cache's, unchanged.
    monkeypatch.delenv("WORLD_SIZE")
    again = TextClassification().prepared(cfg, tmp_path)
    assert not any((cache / "parts").iterdir())
    assert all(np.array_equal(first[k], again[k]) for k in ("x", "y", "xt", "yt"))
    for path in cache.glob("*.*"):  # alone, a rank removes its parts as soon as it wrote the whole cache
        path.unlink()
    alone = TextClassification().prepared(cfg, tmp_path)
    assert sorted(p.suffix for p in cache.glob("*.*")) == [".json", ".npz"] and not any((cache / "parts").iterdir())
    assert all(np.array_equal(first[k], alone[k]) for k in ("x", "y", "xt", "yt"))


def test_prompt_and_completion_columns_are_refused_for_a_classifier():
    from core.config import config_from_dict
    from core.errors import ConfigError
    from tasks import get_task

    raw = {"name": "t", "task": "text_classification", "dataset": {"path": "data", "dvc_file": "data.dvc",
           "label": "category", "expectations_file": "exp.yaml"}, "pretrained": {"path": "models/enc",
                                                                               "prompt_column": "prompt"}}
    with pytest.raises(ConfigError, match=r"^pretrained.prompt_column: prompt/completion pairs are the causal_lm"):
        get_task("text_classification").check_config(config_from_dict(raw))
