"""Models: classifiers for the tabular-image task (raw feature values in; normalisation is
inside) and the byte-level LM (``model.kind: lm``, see ``training.lm``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.config import DatasetConfig, ModelConfig


class _Scale(nn.Module):
    """Maps raw values in [0, value_max] to [0, 1], so callers pass data as stored."""

    def __init__(self, value_max: float):
        super().__init__()
        self.register_buffer("inv", torch.tensor(1.0 / value_max))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.inv


def token_loss(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every target: ``[n, C]`` logits for a classifier, ``[n, T, C]`` for the LM
    (each token is one prediction); computed in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction=reduction)


def example_input(model: ModelConfig, data: DatasetConfig, batch: int = 2) -> torch.Tensor:
    """A zero input batch of the right dtype and shape: float ``[batch, n_features]`` for the
    classifiers, int64 tokens ``[batch, seq_len]`` for the LM."""
    if model.kind == "lm":
        return torch.zeros(batch, model.seq_len, dtype=torch.long)
    return torch.zeros(batch, data.n_features)


def build_model(model: ModelConfig, data: DatasetConfig) -> nn.Module:
    """A small CNN over the square image the features form, an MLP, or the byte LM (``model.kind``)."""
    if model.kind == "lm":
        from training.lm import build_lm

        return build_lm(model)
    n_in, n_out = data.n_features, data.n_classes
    scale = _Scale(data.expectations.value_max)
    if model.kind == "mlp":
        return nn.Sequential(
            scale,
            nn.Linear(n_in, model.hidden),
            nn.ReLU(),
            nn.Dropout(model.dropout),
            nn.Linear(model.hidden, model.hidden),
            nn.ReLU(),
            nn.Linear(model.hidden, n_out),
        )
    side = math.isqrt(n_in)
    if side * side != n_in:
        raise ValueError(f"model.kind=cnn needs a square number of features, got {n_in}")
    c1, c2 = model.channels
    pooled = c2 * (side // 2) * (side // 2)
    return nn.Sequential(
        scale,
        nn.Unflatten(1, (1, side, side)),
        nn.Conv2d(1, c1, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(model.dropout),
        nn.Linear(pooled, model.hidden),
        nn.ReLU(),
        nn.Linear(model.hidden, n_out),
    )
