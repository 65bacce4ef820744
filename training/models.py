"""What the engine asks of a model: the task's model and example input, and the token loss.
Which model a run gets is the task's (``tasks``: the table networks are ``tasks/table_nets.py``,
a user's ``model.factory`` is loaded by ``tasks.factory.load_factory``, re-exported here for the
packages that import it from this module); the byte-level LM is in ``training.lm``."""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from core.config import PipelineConfig
from tasks.factory import load_factory  # noqa: F401  (re-exported)


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
