"""The example's own networks, each a ``model.factory`` ``f(n_inputs, n_outputs, **kwargs)``; the task
wraps them in ``WindowNorm``, so they see each window scaled to mean 0 and std 1 while the exported
program takes and returns raw values. torch is imported here: import this module only where a model
is built.
"""

from __future__ import annotations

import torch
from torch import nn


class WindowNorm(nn.Module):
    """Per-window (instance) normalisation around ``net``: ``net((x - mean) / std) * std + mean``
    with each row's own mean and std, so the model's input and output are in the series' units."""

    def __init__(self, net: nn.Module, eps: float = 1e-3):
        super().__init__()
        self.net, self.eps = net, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=1, keepdim=True)
        std = x.std(dim=1, keepdim=True).clamp_min(self.eps)
        return self.net((x - mean) / std) * std + mean


class ConvForecaster(nn.Module):
    """Two 1-D convolutions (the second dilated) over the window, an MLP head, plus a linear
    skip from the window to the output: the skip alone is an AR model; the convolutions learn
    what a linear model misses (the shape of a cycle)."""

    def __init__(self, n_in: int, n_out: int, channels: int = 16, kernel: int = 5, hidden: int = 32):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Unflatten(1, (1, n_in)),
            nn.Conv1d(1, channels, kernel, padding=kernel // 2),
            nn.ReLU(),
            nn.Conv1d(channels, channels, kernel, padding=2 * (kernel // 2), dilation=2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(channels * n_in, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_out),
        )
        self.skip = nn.Linear(n_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) + self.skip(x)


class GRUForecaster(nn.Module):
    """A one-layer GRU over the window's values; its last hidden state predicts the next value."""

    def __init__(self, n_in: int, n_out: int, hidden: int = 32):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x.unsqueeze(-1))
        return self.head(out[:, -1])


def conv_forecaster(n_in: int, n_out: int, channels: int = 16, kernel: int = 5, hidden: int = 32) -> nn.Module:
    """The task's default network (``model.factory`` unset)."""
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"model.kwargs.kernel: must be odd and >= 1, got {kernel}")
    return ConvForecaster(n_in, n_out, channels, kernel, hidden)


gru_forecaster = GRUForecaster  # ``model.factory: "trainflow_timeseries.model:gru_forecaster"``
