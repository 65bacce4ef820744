"""The ``lm`` task's config options: ``dataset.text`` (a corpus of JSON Lines documents) and the
byte-level transformer's ``model.*`` sizes. Registered into ``core.config``'s schema (torch-free)."""

from __future__ import annotations

from pydantic import Field, model_validator

from core.config import Options, check_ranges, register_options


class TextExpectations(Options):
    """Data-quality bounds of a text corpus (``dataset.kind: text``)."""

    # Each document's UTF-8 size in bytes must lie in this range.
    doc_bytes: tuple[int, int] = (1, 1_000_000)
    train_docs: tuple[int, int] = (1, 1_000_000)
    eval_docs: tuple[int, int] = (1, 1_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> "TextExpectations":
        return check_ranges(self, ("doc_bytes", "train_docs", "eval_docs"))


class TextConfig(Options):
    """A corpus of documents as JSON Lines (``{"path": ..., "text": ...}`` per line), split by file.

    Training windows come from ``train_file`` minus a seeded ``holdout_fraction`` of its
    documents, which feed the per-epoch validation; the evaluation gate scores ``eval_file``,
    documents that neither training nor early stopping ever saw.
    """

    train_file: str = "train.jsonl"
    eval_file: str = "val.jsonl"
    # Tokens per window (byte-level: one token per UTF-8 byte); must equal model.seq_len.
    seq_len: int = Field(128, gt=1)
    # Step between training windows' starts (null: seq_len, i.e. no overlap).
    stride: int | None = Field(None, gt=0)
    holdout_fraction: float = Field(0.1, gt=0, lt=1)
    expectations: TextExpectations = TextExpectations()


class TextDataset(Options):
    text: TextConfig | None = None


class LmModel(Options):
    # lm only (tasks/lm_net.py): tokens are bytes; seq_len is the context (and the longest input).
    vocab_size: int = Field(256, ge=2)
    seq_len: int = Field(64, gt=0)
    d_model: int = Field(64, gt=0)
    n_layers: int = Field(2, gt=0)
    n_heads: int = Field(4, gt=0)
    d_ff: int = Field(256, gt=0)


register_options("dataset", TextDataset)
register_options("model", LmModel)
