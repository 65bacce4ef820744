"""``trainflow init --pretrained``'s profiling and choices (tasks.text_init) with a tiny tokenizer
trained in the test on its own generated text, and the text expectations file's round trip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import ConfigError
from core.text_expectations import TextExpectations, load_text_expectations
from tasks.text_init import (TextInitError, choose_max_length, choose_pooling, fine_tune_choices, jsonl_shape,
                             pick_text_column, profile_jsonl, profile_table, token_lengths)

WORDS = "invoice refund card login crash error screen slow parcel late broken help urgent account".split()


def texts(n: int, seed: int, lo: int = 2, hi: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(lo, hi)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    """The tokenizer tests.hf_models.tiny_encoder saves, without the model (building one imports the
    modeling code: seconds)."""
    from transformers import PreTrainedTokenizerFast

    from tests.hf_models import SPECIALS_WORDPIECE, _wordpiece

    pad, unk, cls, sep, mask = SPECIALS_WORDPIECE
    return PreTrainedTokenizerFast(tokenizer_object=_wordpiece(texts(300, 9), 400), unk_token=unk, pad_token=pad,
                                   cls_token=cls, sep_token=sep, mask_token=mask, model_max_length=32)


def test_max_length_is_p99_rounded_to_8_and_capped_by_positions():
    lengths = list(range(1, 101))  # p99 = 99.01 -> 100 -> 104
    assert choose_max_length(lengths, None)[:2] == (104, 0)
    length, truncated, why = choose_max_length(lengths, 64)
    assert (length, truncated) == (64, 36) and "64 positions" in why


def test_fine_tuning_choices_stay_in_the_usual_ranges():
    small, lines = fine_tune_choices("text_classification", 800, 128, lora=False)
    big, _ = fine_tune_choices("text_classification", 200_000, 512, lora=False)
    lora, _ = fine_tune_choices("causal_lm", 3000, 256, lora=True)
    decoder, _ = fine_tune_choices("causal_lm", 3000, 256, lora=False)
    assert (small["epochs"], big["epochs"], decoder["epochs"]) == (5, 1, 3)
    assert small["early_stopping"] == {"metric": "val_loss", "patience": 2, "restore_best": True}
    assert "early_stopping" not in decoder  # the causal LM's validation is its held-out loss, not an epoch pick
    assert 2e-5 <= big["lr"] <= small["lr"] <= 5e-5 and lora["lr"] == 1e-4 and decoder["lr"] == 2e-5
    assert small["batch_size"] == 16 and big["batch_size"] == 16  # the usual 16 a step; about 8k tokens a rank
    assert small["warmup_epochs"] == pytest.approx(0.5) and small["lr_scaling"] == "none"
    assert len(lines) == 4 and all("(training." in line for line in lines)
    tiny, _ = fine_tune_choices("text_classification", 40, 16, lora=False)
    assert tiny["batch_size"] == 4  # at most an eighth of the rows


@pytest.mark.parametrize("rows, max_length, ranks, per_rank, why", [
    (2640, 24, 2, 16, "64+ optimizer steps an epoch over 2,640 rows"),  # 32 a step, not 128: 82 steps an epoch
    (2640, 24, 1, 32, "64+ optimizer steps"),
    (800, 128, 2, 8, "the usual 16 rows a step"),
    (100_000, 64, 1, 64, "at most about 8,192 tokens a rank"),
    (200_000, 512, 8, 16, "at most about 8,192 tokens a rank"),
    (40, 16, 2, 2, "at most an eighth of the 40 train rows"),
])
def test_a_small_sets_global_batch_keeps_enough_steps_an_epoch_whatever_the_ranks(rows, max_length, ranks,
                                                                                  per_rank, why):
    chosen, lines = fine_tune_choices("text_classification", rows, max_length, lora=False, ranks=ranks)
    assert chosen["batch_size"] == per_rank and chosen["base_batch"] == per_rank
    assert lines[0].startswith(f"batch:        {per_rank} a rank, {per_rank * ranks} a step over the {ranks} rank(s)")
    assert why in lines[0]
    assert rows // (per_rank * ranks) >= min(64, rows // 16) or "tokens" in why  # steps an epoch


def test_pooling_is_mean_where_the_folder_is_a_sentence_encoder_trained_with_mean_pooling(tmp_path):
    import json

    def folder(name, modules, mode):
        (tmp_path / name / "1_Pooling").mkdir(parents=True)
        (tmp_path / name / "modules.json").write_text(json.dumps(modules))
        (tmp_path / name / "1_Pooling" / "config.json").write_text(json.dumps({f"pooling_mode_{mode}": True}))
        return tmp_path / name

    st = [{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
          {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    pooling, why = choose_pooling(folder("st", st, "mean_tokens"))
    assert pooling == "mean" and "1_Pooling/config.json" in why
    assert choose_pooling(folder("cls", st, "cls_token"))[0] == "cls"
    assert choose_pooling(tmp_path / "plain")[0] == "cls" and choose_pooling(None)[0] == "cls"
    outside = [{"path": "../st/1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    assert choose_pooling(folder("out", outside, "mean_tokens"))[0] == "cls"  # never read outside the folder


def test_text_column_is_the_longest_in_tokens_unless_named(tokenizer):
    df = pd.DataFrame({"code": ["A1", "B2"] * 50, "body": texts(100, 1, 10, 30), "label": ["x", "y"] * 50})
    assert pick_text_column(df, "label", tokenizer, None, "t")[0] == "body"
    assert pick_text_column(df, "label", tokenizer, "code", "t") == ("code", "named with --text-column")
    with pytest.raises(TextInitError, match=r"--text-column 'bdy' is not a column of t \(did you mean 'body'\?\)"):
        pick_text_column(df, "label", tokenizer, "bdy", "t")
    with pytest.raises(TextInitError, match="no text column besides the label"):
        pick_text_column(pd.DataFrame({"n": [1, 2], "label": ["a", "b"]}), "label", tokenizer, None, "t")


def test_table_profile_says_lengths_truncation_and_classes(tokenizer):
    train = pd.DataFrame({"body": texts(300, 2), "category": ["a", "b", "b"] * 100})
    test = pd.DataFrame({"body": texts(100, 3), "category": ["a", "b"] * 50})
    p = profile_table({"train": train, "test": test}, "category", tokenizer, 32, None, "t", False, True)
    lengths = token_lengths(tokenizer, [*train.body, *test.body])
    assert p.task == "text_classification" and p.pretrained == {"text_column": "body", "max_length": p.max_length}
    assert p.max_length <= 32 and p.truncated == sum(n > p.max_length for n in lengths) > 0
    assert p.p50 == int(np.ceil(np.percentile(lengths, 50)))
    assert p.classes == ["a", "b"] and p.shares["b"] == pytest.approx(250 / 400)
    said = "\n".join(p.lines)
    assert f"{p.truncated} row(s) longer are truncated" in said and "classes:      2: a 38%, b 62%" in said
    exp = p.expectations
    assert exp.labels == ["a", "b"] and exp.rows == {"train": (150, 600), "test": (50, 200)} and exp.no_leak
    assert exp.tokens["body"][1] >= max(lengths) and exp.chars["body"][0] >= 1
    with pytest.raises(TextInitError, match="single class"):
        profile_table({"all": train.assign(category="a")}, "category", tokenizer, 32, None, "t", False, False)


def test_jsonl_shape_and_profile(tokenizer):
    pairs = [{"prompt": t, "completion": u} for t, u in zip(texts(50, 4), texts(50, 5))]
    assert jsonl_shape(pairs, "f")[0] == ["prompt", "completion"]
    assert jsonl_shape([{"text": "a"}], "f")[0] == ["text"]
    with pytest.raises(TextInitError, match=r"f record 3: 'completion' is int, not a string"):
        jsonl_shape([*pairs[:2], {"prompt": "x", "completion": 3}], "f")
    with pytest.raises(TextInitError, match="needs a string 'text', or 'prompt' and 'completion'"):
        jsonl_shape([{"body": "x"}], "f")
    p = profile_jsonl({"all": pairs}, tokenizer, 32, "f", True, False)
    assert p.task == "causal_lm" and p.pretrained["prompt_column"] == "prompt"
    assert p.training["lr"] == 1e-4 and not p.expectations.no_leak and set(p.expectations.tokens) == {
        "prompt", "completion"}


def test_text_expectations_round_trip_and_refuse_bad_bounds(tmp_path):
    exp = TextExpectations(format="table", columns=["body"], label="y", labels=["a", "b: c"],
                           chars={"body": (1, 90)}, tokens={"body": (2, 30)}, rows={"train": (5, 20)})
    path = tmp_path / "e.yaml"
    path.write_text(exp.to_yaml("# reviewed\n"))
    assert load_text_expectations(path) == exp
    path.write_text(exp.to_yaml().replace("[2, 30]", "[30, 2]"))
    with pytest.raises(ConfigError, match=r"e.yaml: .*tokens.body: needs 0 <= lower <= upper, got \[30, 2\]"):
        load_text_expectations(path)


def test_data_that_already_leaks_is_said_and_not_refused_by_its_own_expectations(tokenizer):
    train = pd.DataFrame({"body": texts(100, 6, 5, 20), "category": ["a", "b"] * 50})
    test = pd.DataFrame({"body": [train.body[3], train.body[8], *texts(38, 7, 5, 20)], "category": ["a", "b"] * 20})
    p = profile_table({"train": train, "test": test}, "category", tokenizer, 32, None, "t", False, True)
    assert not p.expectations.no_leak
    assert any(line.startswith("duplicates:   2 test text(s) also in train") for line in p.lines)
    clean = profile_table({"train": train, "test": test[2:]}, "category", tokenizer, 32, None, "t", False, True)
    assert clean.expectations.no_leak and not any(line.startswith("duplicates:") for line in clean.lines)
