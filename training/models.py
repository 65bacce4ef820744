"""What the engine asks of a model: the task's model and example input (``tasks``)."""

from __future__ import annotations

import torch
from torch import nn

from core.config import PipelineConfig
from tasks import get_task


def example_input(cfg: PipelineConfig, info: dict, batch: int = 2) -> torch.Tensor:
    """A batch of the task's input (float ``[batch, n_features]`` for a table, int64 tokens for the LM)."""
    return get_task(cfg.task).example_input(cfg, info, batch)


def build_model(cfg: PipelineConfig, info: dict) -> nn.Module:
    """The task's model for data described by ``info`` (``Splits.info``)."""
    return get_task(cfg.task).build_model(cfg, info)
