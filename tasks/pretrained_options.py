"""The pretrained tasks' config options (text_classification, causal_lm): the top-level
``pretrained:`` section. Registered into ``core.config``'s schema (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core.config import Options, register_options
from core.config_id import add_later_key


class LoraConfig(Options):
    """Low-rank adapters (peft) on a pretrained model; merged into the exported weights."""

    r: int = Field(8, gt=0)
    alpha: int = Field(16, gt=0)
    dropout: float = Field(0.05, ge=0, lt=1)
    # Module names to adapt (e.g. query, value; c_attn); empty: peft's default for the architecture.
    target_modules: list[str] = []


class PretrainedConfig(Options):
    """A Hugging Face model folder inside the repository (tracked by DVC like a dataset) that the
    text_classification and causal_lm tasks fine-tune. Loaded offline, safetensors only, never
    with remote code (tasks/hf_folder.py)."""

    # The folder, relative to the repository root: config.json, *.safetensors, tokenizer files.
    path: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
    # Its DVC file (default: the folder's path + .dvc): its md5 joins the manifest and the model's tags.
    dvc_file: str = Field(default_factory=lambda data: data["path"].rstrip("/") + ".dvc", min_length=1)
    # text_classification: the free-text column of the table (the label is dataset.label).
    text_column: str = Field("text", min_length=1)
    # causal_lm on JSON Lines: ``text`` is packed into max_length sequences; ``prompt`` + ``completion``
    # pairs train on the completion's tokens only.
    prompt_column: str | None = None
    completion_column: str | None = None
    # Tokens per sequence: init writes the text's p99 token length, capped by the model's positions.
    max_length: int = Field(128, gt=1)
    # Recompute each block's activations in backward: less memory for more compute.
    activation_checkpointing: bool = False
    # text_classification: what the head reads. cls: the [CLS] token through the model's pooler (the
    # sequence-classification head transformers builds); mean: the mean of the last hidden states over
    # the text's tokens, as a sentence encoder (sentence-transformers, pooling_mode_mean_tokens) was
    # trained to be read. init picks mean where the folder's 1_Pooling/config.json says so.
    pooling: Literal["cls", "mean"] = "cls"
    lora: LoraConfig | None = None


class Pretrained(Options):
    # The pretrained model folder (text_classification, causal_lm); null for tasks that build their net.
    pretrained: PretrainedConfig | None = None


register_options("", Pretrained)
add_later_key(("pretrained", "pooling"), "cls")
