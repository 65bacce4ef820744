"""Model building blocks: the networks of the table tasks (built-in or ``model.factory``), the
standardisation and de-scaling layers baked into them, and the token loss. Which model a run
gets is the task's (``tasks``); the byte-level LM is in ``training.lm``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.config import ModelConfig, PipelineConfig


class Standardize(nn.Module):
    """``(x - mean) / std`` per feature, with the train split's statistics as buffers: the model
    (and its exported program) takes raw feature values. A missing value (NaN) becomes 0, the
    train mean: imputation that travels with the model."""

    def __init__(self, mean, std):
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
        self.register_buffer("inv_std", 1.0 / torch.as_tensor(std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) * self.inv_std
        return torch.where(torch.isnan(z), torch.zeros_like(z), z)


class Affine(nn.Module):
    """``x * scale + shift``: a regression's standardised output back in the target's units."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.register_buffer("shift", torch.tensor(float(shift)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


def token_loss(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every target: ``[n, C]`` logits for a classifier, ``[n, T, C]`` for the LM
    (each token is one prediction); computed in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction=reduction)


def example_input(cfg: PipelineConfig, info: dict, batch: int = 2) -> torch.Tensor:
    """A batch of the task's input (float ``[batch, n_features]`` for a table, int64 tokens for the LM)."""
    from tasks import get_task

    return get_task(cfg.task).example_input(cfg, info, batch)


def build_model(cfg: PipelineConfig, info: dict) -> nn.Module:
    """The task's model for data described by ``info`` (``Splits.info``)."""
    from tasks import get_task

    return get_task(cfg.task).build_model(cfg, info)


def load_factory(ref: str):
    """``"module.path:function"`` -> the function (imported from the repository or a package)."""
    import importlib

    module, _, name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"model.factory: cannot import {ref!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"model.factory: {ref!r} is not callable")
    return fn


def build_core(model: ModelConfig, n_in: int, n_out: int) -> nn.Module:
    """The network between the standardised features and the ``n_out`` outputs: the user's
    ``model.factory(n_in, n_out, **model.kwargs)``, a small CNN over the square image the
    features form, or an MLP (``model.kind``; left out: the MLP, which fits any table)."""
    if model.factory is not None:
        net = load_factory(model.factory)(n_in, n_out, **model.kwargs)
        if not isinstance(net, nn.Module):
            raise ValueError(f"model.factory: {model.factory} returned {type(net).__name__}, not an nn.Module")
        return net
    if model.kind in (None, "mlp"):
        return nn.Sequential(
            nn.Linear(n_in, model.hidden),
            nn.ReLU(),
            nn.Dropout(model.dropout),
            nn.Linear(model.hidden, model.hidden),
            nn.ReLU(),
            nn.Linear(model.hidden, n_out),
        )
    side = math.isqrt(n_in)
    if side * side != n_in:
        raise ValueError(f"model.kind: cnn needs a square number of features, got {n_in}; use mlp")
    c1, c2 = model.channels
    pooled = c2 * (side // 2) * (side // 2)
    return nn.Sequential(
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
