"""Export a trained model as a ``torch.export`` program (``model.pt2``) with a dynamic batch."""

from __future__ import annotations

from pathlib import Path

import torch


def export_model(model: torch.nn.Module, n_features: int | torch.Tensor, path: Path) -> Path:
    """Save ``model`` (eval mode, CPU) as an ExportedProgram with a dynamic batch dimension.

    ``n_features`` (int): float32 ``[batch, n_features]`` -> logits. A tensor instead is the
    example input (``training.models.example_input``); an int64 ``[batch, seq]`` token example
    (the LM) also gets a dynamic sequence length, 1..seq.
    """
    model = model.to("cpu").eval()
    example = n_features if isinstance(n_features, torch.Tensor) else torch.zeros(2, n_features)
    dims = {0: torch.export.Dim("batch", min=1)}
    if example.dtype == torch.long and example.dim() == 2:
        dims[1] = torch.export.Dim("seq", min=1, max=int(example.shape[1]))
    program = torch.export.export(model, (example,), dynamic_shapes=(dims,))
    torch.export.save(program, str(path))
    return path


def load_exported(path: Path) -> torch.nn.Module:
    """The callable module of a saved ``model.pt2``."""
    return torch.export.load(str(path)).module()


# -- scoring the exported program where it was made ----------------------------------------
def score_exported(pt2: Path, x, n_probes: int = 200, warmup: int = 20) -> dict:
    """Predictions of the saved program ``pt2`` on features ``x`` [n, f] and its one-row latency.

    What the pipeline's evaluate stage would compute by loading ``pt2`` itself, done in the
    training worker that just wrote it (torch and the program's loader are loaded there
    already), so the pipeline process never imports torch. The program is loaded back from
    the file: the scores are the saved artifact's, not the in-memory model's.
    Latency: ``n_probes`` one-row calls after ``warmup``, cycling through ``x``'s rows, in ms.
    """
    import time

    program = load_exported(pt2)
    xt = torch.as_tensor(x, dtype=torch.float32)
    with torch.no_grad():
        logits = program(xt)
        rows = [xt[i % len(xt)][None, :] for i in range(n_probes + warmup)]
        times = []
        for i, row in enumerate(rows):
            t0 = time.perf_counter()
            program(row).argmax(1).numpy()
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000)
    return {"pred": logits.argmax(1).tolist(), "logits_shape": list(logits.shape), "latency_ms": times,
            "threads": torch.get_num_threads()}
