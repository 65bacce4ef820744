"""Export a trained model as a ``torch.export`` program (``model.pt2``) with a dynamic batch."""

from __future__ import annotations

from pathlib import Path

import torch


def export_model(model: torch.nn.Module, n_features: int | torch.Tensor, path: Path) -> Path:
    """Save ``model`` (eval mode, CPU) as an ExportedProgram with a dynamic batch dimension.
    ``n_features``: the example input, or an int for float32 ``[batch, n_features]``; an int64
    ``[batch, seq]`` example also gets a dynamic sequence length, 1..seq."""
    model = model.to("cpu").eval()
    example = n_features if isinstance(n_features, torch.Tensor) else torch.zeros(2, n_features)
    dims = {0: torch.export.Dim("batch", min=1)}
    if example.dtype == torch.long and example.dim() == 2:
        dims[1] = torch.export.Dim("seq", min=1, max=int(example.shape[1]))
    torch.export.save(torch.export.export(model, (example,), dynamic_shapes=(dims,)), str(path))
    return path


def load_exported(path: Path) -> torch.nn.Module:
    """The callable module of a saved ``model.pt2``."""
    return torch.export.load(str(path)).module()
