"""Tiny Hugging Face model folders built in the test itself: random weights from a config, and a
tokenizer trained on the test's own text. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS_WORDPIECE = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _wordpiece(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(list(texts), trainers.WordPieceTrainer(vocab_size=vocab_size,
                                                                   special_tokens=SPECIALS_WORDPIECE))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.decoder = decoders.WordPiece()
    return tok


def _bpe(texts, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def tiny_encoder(folder: Path, texts, hidden: int = 32, layers: int = 2, vocab_size: int = 400,
                 positions: int = 128, seed: int = 0) -> Path:
    """A BERT-like encoder folder (config.json, model.safetensors, tokenizer files)."""
    import torch
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tok = _wordpiece(texts, vocab_size)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=positions)
    config = BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=hidden * 2, max_position_embeddings=positions,
                        pad_token_id=tok.token_to_id("[PAD]"))
    folder = Path(folder)
    BertModel(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def tiny_decoder(folder: Path, texts, hidden: int = 32, layers: int = 2, vocab_size: int = 400,
                 positions: int = 128, seed: int = 0) -> Path:
    """A GPT-2-like decoder folder (config.json, model.safetensors, tokenizer files)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    tok = _bpe(texts, vocab_size)
    eos = "<|endoftext|>"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eos, eos_token=eos, unk_token=eos,
                                   model_max_length=positions)
    config = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=hidden, n_layer=layers, n_head=2,
                        n_positions=positions, bos_token_id=tok.token_to_id(eos), eos_token_id=tok.token_to_id(eos))
    folder = Path(folder)
    GPT2LMHeadModel(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def pickle_only(folder: Path) -> Path:
    """A folder whose only weights are a pickle (``pytorch_model.bin``)."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    torch.save({"w": torch.zeros(2)}, folder / "pytorch_model.bin")
    return folder


def remote_code(folder: Path, texts) -> Path:
    """A valid folder whose config asks for remote code (``auto_map``)."""
    folder = tiny_encoder(folder, texts)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    return folder
