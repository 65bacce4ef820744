"""The reviewed expectations of a text dataset that a pretrained model fine-tunes on (the
``text_classification`` and ``causal_lm`` tasks), written by ``trainflow init --pretrained`` from a
profile made with the model's own tokenizer, reviewed and committed by the user, enforced by
validation (``validation.pretrained_suite``)::

    version: 1
    format: table                 # table (CSV/Parquet) | jsonl
    columns: [text]               # the text columns (jsonl: text, or prompt + completion)
    label: category               # text_classification: the label column ...
    labels: [billing, bug, other] # ... and its class set, in the model's output order
    chars: {text: [1, 1200]}      # each text's length in characters
    tokens: {text: [2, 310]}      # and in the model's tokens (special tokens included)
    rows: {train: [400, 1600], test: [100, 400]}
    no_leak: true                 # no text of the test split is also in the train split

Every text must be non-empty (not only whitespace). No torch, pandas or YAML work at import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from core.expectations import _Strict, load_expectations


class TextExpectations(_Strict):
    version: Literal[1] = 1
    format: Literal["table", "jsonl"]
    columns: list[str] = Field(min_length=1)
    label: str | None = None
    labels: list[Any] | None = None
    chars: dict[str, tuple[int, int]] = {}
    tokens: dict[str, tuple[int, int]] = {}
    rows: dict[Literal["train", "test"], tuple[int, int]] = {}
    no_leak: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> "TextExpectations":
        for key in ("chars", "tokens"):
            for column, (lo, hi) in getattr(self, key).items():
                if column not in self.columns:
                    raise ValueError(f"{key}.{column}: not one of the columns {self.columns}")
                if lo < 0 or lo > hi:
                    raise ValueError(f"{key}.{column}: needs 0 <= lower <= upper, got [{lo}, {hi}]")
        for split, (lo, hi) in self.rows.items():
            if lo < 0 or lo > hi:
                raise ValueError(f"rows.{split}: needs 0 <= lower <= upper, got [{lo}, {hi}]")
        if (self.label is None) != (self.labels is None):
            raise ValueError("labels: give label and labels together (text_classification) or neither")
        if self.labels is not None and len(set(map(str, self.labels))) != len(self.labels):
            raise ValueError("labels: duplicates")
        return self

    def to_yaml(self, header: str = "") -> str:
        import yaml

        def flow(value) -> str:
            return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()

        data = self.model_dump(mode="json", exclude_none=True)
        lines = [f"{k}: {flow(data[k])}" for k in ("version", "format", "columns", "label", "labels") if k in data]
        for key in ("chars", "tokens", "rows"):  # one line a bound: a reviewer reads a table, not a tree
            if data[key]:
                lines.append(f"{key}:")
                lines += [f"  {flow(k)}: [{lo}, {hi}]" for k, (lo, hi) in data[key].items()]
        lines.append(f"no_leak: {str(data['no_leak']).lower()}")
        return header + "\n".join(lines) + "\n"


def load_text_expectations(path: str | Path) -> TextExpectations:
    """Read and check a text expectations file; ConfigError naming the file and the key path."""
    return load_expectations(path, TextExpectations, "`trainflow init --pretrained`")
