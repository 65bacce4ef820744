"""What the models-from-code files (``tasks/pyfunc_*.py``) share: meta.json, input checks, batched
forward passes, class decisions and text scores.

The registry logs this file into each model's ``code/`` folder (``ModelSpec.code_paths``), hashes it
like every file a load runs, and MLflow puts that folder first on ``sys.path`` when it loads the model.
So, like the files that import it, it imports no project code, and torch only where a model runs.
"""

import json
import os

import numpy as np
import pandas as pd

# Rows (or windows) per forward pass: bounds the memory of a large request.
CHUNK = 64
# A program's rows per pass as the evaluation's (``tasks.base.PROGRAM_ROWS``): a rescore gets its bits.
PROGRAM_ROWS = 1024


def offline() -> None:
    """Hugging Face offline and quiet, before transformers is imported: a model loads from its own folder."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)


def meta(context) -> dict:
    """The model's ``meta.json`` artifact, written by its task at registration."""
    with open(context.artifacts["meta"]) as fh:
        return json.load(fh)


def program(context):
    """The ``model`` artifact's ``torch.export`` program as a module (it unpickles: the registry checked
    its sha256 before the load)."""
    import torch

    return torch.export.load(context.artifacts["model"]).module()


def labels(values) -> np.ndarray | None:
    """Class labels in order, as objects when any is text, else int64; None for a regression."""
    if values is None:
        return None
    return np.asarray(values, dtype=object if any(isinstance(c, str) for c in values) else np.int64)


def method(params, allowed=("predict", "predict_proba")) -> str:
    """``params["predict_method"]``, the first of ``allowed`` when absent; anything else is refused."""
    chosen = (params or {}).get("predict_method") or allowed[0]
    if chosen not in allowed:
        raise ValueError(f"params.predict_method: must be one of {', '.join(allowed)}, got {chosen!r}")
    return chosen


def column(model_input, name: str, holding: str) -> pd.Series:
    """The DataFrame's column ``name``; anything else is refused, saying what the column holds."""
    if not isinstance(model_input, pd.DataFrame) or name not in model_input.columns:
        frame = isinstance(model_input, pd.DataFrame)
        got = list(model_input.columns)[:5] if frame else type(model_input).__name__
        raise ValueError(f"expected a DataFrame with a column {name!r} of {holding}, got {got}")
    return model_input[name]


def texts(model_input) -> list:
    """The ``text`` column (or a list of strings) as a list; a row that is not text is refused by number."""
    frame = isinstance(model_input, pd.DataFrame)
    values = column(model_input, "text", "text").tolist() if frame else list(model_input)
    bad = [i for i, t in enumerate(values) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"column 'text': rows {bad[:5]} are not text")
    return values


def forward(fn, *arrays, rows: int = CHUNK) -> np.ndarray:
    """``fn`` over the rows of ``arrays``, ``rows`` at a time, in torch's inference mode (numpy arrays go
    in as tensors, copied: pandas may hand back a read-only view): its outputs as one float64 array,
    empty for no rows."""
    import torch

    with torch.inference_mode():
        out = [fn(*(torch.tensor(a[s:s + rows]) if isinstance(a, np.ndarray) else a[s:s + rows] for a in arrays))
               .double().numpy() for s in range(0, len(arrays[0]), rows)]
    return np.concatenate(out) if out else np.empty(0)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Class probabilities in float64, computed as ``tasks/metrics.py``'s ``softmax`` (the same bits as
    the evaluation's, so a rescored model's ranking metrics equal its recorded ones)."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def classes(logits: np.ndarray, class_labels: np.ndarray, chosen: str, threshold=None):
    """A classifier's answer: ``predict_proba``'s class probabilities, a column per label, else the
    labels: a binary one's second where its probability is at least ``threshold``, else the likeliest."""
    proba = softmax(logits) if len(logits) else np.empty((0, len(class_labels)))
    if chosen == "predict_proba":
        return pd.DataFrame(proba, columns=class_labels.tolist())
    if threshold is not None and proba.shape[1] == 2:
        return class_labels[(proba[:, 1] >= threshold).astype(np.int64)]
    return class_labels[proba.argmax(axis=1)]


def scores(loss_sum: np.ndarray, n_tokens: np.ndarray) -> pd.DataFrame:
    """A language model's answer per text: mean ``loss`` per target token (nats; NaN with none),
    ``perplexity`` and ``n_tokens``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = np.where(n_tokens > 0, loss_sum / np.maximum(n_tokens, 1), np.nan)
    return pd.DataFrame({"loss": loss, "perplexity": np.exp(loss), "n_tokens": n_tokens})
