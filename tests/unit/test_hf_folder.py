"""tasks.hf_folder: a local model folder is checked before transformers sees it, and loads offline."""

from __future__ import annotations

import os

import pytest

from tasks.hf_folder import PretrainedFolderError, check_folder, load_model, load_tokenizer, transformer_blocks
from tests.hf_models import pickle_only, remote_code, tiny_decoder, tiny_encoder

TEXTS = [f"ticket {i}: the printer on floor {i % 7} is jammed again" for i in range(60)] + \
        [f"order {i}: please refund the parcel that never came" for i in range(60)]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "enc", TEXTS)


def test_an_encoder_folder_loads_offline_with_a_new_head_for_the_given_labels(encoder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    facts = check_folder(encoder)
    assert facts.model_type == "bert" and facts.weights == ("model.safetensors",) and facts.max_positions == 128
    tok = load_tokenizer(encoder)
    model = load_model(encoder, "sequence_classification", num_labels=2, labels=["order", "ticket"])
    batch = tok(["the printer is jammed", "refund"], padding=True, return_tensors="pt")
    assert model(**batch).logits.shape == (2, 2)
    assert model.config.id2label == {0: "order", 1: "ticket"}
    assert len(transformer_blocks(model)) == 2


def test_a_decoder_folder_gets_its_eos_as_pad_and_a_causal_head(tmp_path):
    folder = tiny_decoder(tmp_path / "dec", TEXTS)
    tok = load_tokenizer(folder)
    assert tok.pad_token == tok.eos_token
    model = load_model(folder, "causal_lm")
    ids = tok(["the printer"], return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size
    assert len(transformer_blocks(model)) == 2


def test_bf16_weights_load_as_fp32_to_train(tmp_path):
    import torch

    folder = tiny_decoder(tmp_path / "dec", TEXTS)
    load_model(folder, "causal_lm").to(torch.bfloat16).save_pretrained(folder)  # as most hub decoders ship
    assert check_folder(folder).config.get("dtype") == "bfloat16"
    model = load_model(folder, "causal_lm")  # AdamW's state and updates in fp32; bf16 comes from autocast
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_a_pickle_only_folder_is_refused_in_one_line_naming_the_file(tmp_path):
    with pytest.raises(PretrainedFolderError) as err:
        check_folder(pickle_only(tmp_path / "old"))
    assert "pytorch_model.bin" in str(err.value) and "\n" not in str(err.value)


def test_a_config_asking_for_remote_code_is_refused_naming_the_file_and_nothing_runs(tmp_path):
    folder = remote_code(tmp_path / "evil", TEXTS)
    with pytest.raises(PretrainedFolderError, match=r"config\.json asks for remote code"):
        load_model(folder, "sequence_classification", num_labels=2)


def test_a_link_out_of_the_folder_is_refused_naming_the_link(encoder, tmp_path):
    folder = tmp_path / "linked"
    folder.mkdir()
    for item in encoder.iterdir():
        os.symlink(item, folder / item.name)
    with pytest.raises(PretrainedFolderError, match="config.json links outside the folder"):
        check_folder(folder)


def test_an_unknown_model_type_and_a_missing_folder_are_refused(encoder, tmp_path):
    with pytest.raises(PretrainedFolderError, match="not a folder"):
        check_folder(tmp_path / "nope")
    folder = tmp_path / "odd"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "no-such-arch"}')
    (folder / "model.safetensors").write_bytes((encoder / "model.safetensors").read_bytes())
    with pytest.raises(PretrainedFolderError, match="no-such-arch"):
        check_folder(folder)
