"""Export a trained model as a ``torch.export`` program (``model.pt2``) with a dynamic batch."""

from __future__ import annotations

from pathlib import Path

import torch


def export_model(model: torch.nn.Module, n_features: int, path: Path) -> Path:
    """Save ``model`` (eval mode, CPU) as an ExportedProgram: float32 [batch, n_features] -> logits."""
    model = model.to("cpu").eval()
    example = (torch.zeros(2, n_features),)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, example, dynamic_shapes=({0: batch},))
    torch.export.save(program, str(path))
    return path


def load_exported(path: Path) -> torch.nn.Module:
    """The callable module of a saved ``model.pt2``."""
    return torch.export.load(str(path)).module()
