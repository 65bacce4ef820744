"""A Hugging Face model folder on local disk, as ``save_pretrained`` or ``hf download --local-dir``
leaves it, checked and loaded without the network and without running code from it.

The folder is untrusted input (a model folder is data a user brings), so before ``transformers``
sees it:

- weights must be ``*.safetensors``: a folder with only pickle weights (``*.bin``, ``*.pt``,
  ``*.pth``, ``*.ckpt``) is refused in one line, because unpickling runs code. trainflow never
  falls back to ``torch.load`` for them, not even with ``weights_only=True``: a conversion is one
  command the user runs once, on a folder they trust;
- a config or tokenizer config that asks for remote code (``auto_map``) is refused, naming the
  file; ``trust_remote_code`` is never passed as true;
- every file is a plain file inside the folder: a link out of it is refused, naming the link
  (a hub *cache* snapshot is all links into ``blobs/``: ``--local-dir`` copies real files);
- the ``model_type`` must be one this ``transformers`` knows.

Every load passes ``local_files_only=True``; :func:`offline_env` is the environment a process
that loads a folder runs with (the hub client reads it when imported), set by whoever starts it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
CONFIG_FILES = ("config.json", "tokenizer_config.json", "generation_config.json", "preprocessor_config.json")
# Sequence-length keys, by the names the architectures in transformers use.
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "TOKENIZERS_PARALLELISM": "false"}


class PretrainedFolderError(ConfigError):
    """The model folder cannot be used; the message names the folder and the file."""


@dataclass(frozen=True)
class FolderFacts:
    path: Path
    model_type: str
    architectures: tuple[str, ...]
    weights: tuple[str, ...]  # the safetensors files (relative names), sorted
    max_positions: int | None
    has_tokenizer: bool
    config: dict


def offline_env() -> dict[str, str]:
    """Environment for a process that loads a model folder: the hub client never goes online."""
    return dict(OFFLINE_ENV)


def _read_json(path: Path, folder: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PretrainedFolderError(f"{folder}: {path.name} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PretrainedFolderError(f"{folder}: {path.name} must hold a JSON object")
    return data


def max_positions(config: dict) -> int | None:
    """The longest sequence the model's positions allow, or None when the config does not say."""
    for key in POSITION_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_folder(path: str | Path) -> FolderFacts:
    """Check a model folder as described above; PretrainedFolderError naming the folder and file."""
    folder = Path(path)
    if not folder.is_dir():
        raise PretrainedFolderError(f"{folder}: not a folder (a Hugging Face model folder: config.json, "
                                    "*.safetensors and the tokenizer files)")
    root = folder.resolve()
    files = []
    for item in sorted(folder.rglob("*")):
        rel = item.relative_to(folder).as_posix()
        if any(part.startswith(".") for part in item.relative_to(folder).parts):
            continue  # .dvc, .gitignore, .cache: not part of the model
        if item.is_symlink():
            target = item.resolve()
            if not target.is_relative_to(root):
                raise PretrainedFolderError(f"{folder}: {rel} links outside the folder (to {target}); copy the "
                                            "files in (`hf download --local-dir` writes real files)")
        if item.is_file():
            files.append(rel)
    if "config.json" not in files:
        raise PretrainedFolderError(f"{folder}: no config.json (a folder as save_pretrained writes it)")
    for name in CONFIG_FILES:
        if name in files:
            data = _read_json(folder / name, folder)
            if "auto_map" in data or data.get("trust_remote_code"):
                raise PretrainedFolderError(f"{folder}: {name} asks for remote code (auto_map); trainflow never "
                                            "runs code from a model folder")
    config = _read_json(folder / "config.json", folder)
    weights = tuple(f for f in files if f.endswith(".safetensors"))
    if not weights:
        pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise PretrainedFolderError(
                f"{folder}: only pickle weights ({', '.join(pickles[:3])}); trainflow loads *.safetensors only, "
                "because unpickling runs code: convert once with model.save_pretrained(DIR, "
                "safe_serialization=True) where you trust the file")
        raise PretrainedFolderError(f"{folder}: no *.safetensors weights")
    model_type = config.get("model_type")
    from transformers import CONFIG_MAPPING

    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise PretrainedFolderError(f"{folder}: config.json model_type {model_type!r} is not an architecture "
                                    "this transformers knows")
    has_tokenizer = "tokenizer.json" in files or "tokenizer_config.json" in files
    return FolderFacts(path=folder, model_type=model_type, architectures=tuple(config.get("architectures") or ()),
                       weights=weights, max_positions=max_positions(config), has_tokenizer=has_tokenizer,
                       config=config)


def _quiet():
    """transformers' load report (new heads' weights MISSING) and progress bars off: expected, not news."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def load_tokenizer(path: str | Path):
    """The folder's tokenizer (a fast tokenizer), offline. A decoder without a pad token gets its
    end-of-sequence token as pad, as fine-tuning recipes do."""
    facts = check_folder(path)
    if not facts.has_tokenizer:
        raise PretrainedFolderError(f"{facts.path}: no tokenizer files (tokenizer.json or tokenizer_config.json)")
    _quiet()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(facts.path), local_files_only=True, trust_remote_code=False)
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str | Path, head: str, num_labels: int | None = None, labels: list[str] | None = None):
    """The folder's model with ``head``: ``"sequence_classification"`` (a new head of ``num_labels``
    classes, named by ``labels`` when given), ``"causal_lm"`` or ``"encoder"`` (no head: the last
    hidden states). safetensors only, offline, no remote code. The weights load in fp32 whatever the
    folder stores (most decoders ship bf16): they are what the optimizer updates and keeps state for;
    bf16 comes from ``training.precision``'s autocast."""
    facts = check_folder(path)
    _quiet()
    import torch
    import transformers

    auto = {"sequence_classification": transformers.AutoModelForSequenceClassification,
            "causal_lm": transformers.AutoModelForCausalLM, "encoder": transformers.AutoModel}.get(head)
    if auto is None:
        raise ValueError(f"head {head!r}: expected sequence_classification, causal_lm or encoder")
    kwargs = {"local_files_only": True, "trust_remote_code": False, "use_safetensors": True, "dtype": torch.float32}
    if head == "sequence_classification":
        if not num_labels:
            raise ValueError("num_labels is required for a classification head")
        kwargs["num_labels"] = num_labels
        if labels:
            kwargs["id2label"] = dict(enumerate(labels))
            kwargs["label2id"] = {name: i for i, name in enumerate(labels)}
    try:
        model = auto.from_pretrained(str(facts.path), **kwargs)
    except ValueError as exc:  # an architecture without this head
        raise PretrainedFolderError(f"{facts.path}: {facts.model_type} has no {head} head ({exc})") from None
    if head == "sequence_classification" and model.config.pad_token_id is None:
        model.config.pad_token_id = facts.config.get("eos_token_id") if isinstance(
            facts.config.get("eos_token_id"), int) else 0
    return model


def transformer_blocks(model) -> list:
    """The model's repeated blocks (the longest ``ModuleList`` of one class): what FSDP2 shards one
    by one, and what activation checkpointing wraps."""
    import torch

    best: list = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > len(best):
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                best = list(module)
    return best
