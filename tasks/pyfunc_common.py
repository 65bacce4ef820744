"""What the models-from-code files (``tasks/pyfunc_*.py``) share: meta.json, input checks, batched
forward passes, class decisions, and the language models' scoring rules, which their tasks'
evaluations run too (``tasks/lm_eval.py``, ``tasks/causal_lm_eval.py``).

The registry logs this file into each model's ``code/`` folder (``ModelSpec.code_paths``), hashes it
like every file a load runs, and MLflow puts that folder first on ``sys.path`` when it loads the model.
So, like the files that import it, it imports no project code; torch and pandas only where needed
(the lm and causal_lm tasks import it, and their processes need not load pandas).
"""

import json
import os

import numpy as np

# Rows (or windows) per forward pass: bounds the memory of a large request.
CHUNK = 64
# A program's rows per pass as the evaluation's (``tasks.base.PROGRAM_ROWS``): a rescore gets its bits.
PROGRAM_ROWS = 1024


def offline() -> None:
    """Hugging Face offline and quiet, before transformers is imported: a model loads from its own folder."""
    for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("HF_HUB_DISABLE_TELEMETRY", "1"),
                       ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(key, value)


def load_weights(auto, folder: str):
    """``auto.from_pretrained(folder)`` in eval mode: local safetensors only, no remote code, and quiet:
    no progress bar, and no load report of weights the export leaves out on purpose (the [CLS]
    pooler that mean pooling never reads). The process's own transformers settings are put back."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        return auto.from_pretrained(folder, local_files_only=True, trust_remote_code=False,
                                    use_safetensors=True).eval()
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


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


def column(model_input, name: str, holding: str) -> "pd.Series":
    """The DataFrame's column ``name``; anything else is refused, saying what the column holds."""
    import pandas as pd

    if not isinstance(model_input, pd.DataFrame) or name not in model_input.columns:
        frame = isinstance(model_input, pd.DataFrame)
        got = list(model_input.columns)[:5] if frame else type(model_input).__name__
        raise ValueError(f"expected a DataFrame with a column {name!r} of {holding}, got {got}")
    return model_input[name]


def texts(model_input) -> list:
    """The ``text`` column (or a list of strings) as a list; a row that is not text is refused by number."""
    import pandas as pd

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
    """Class probabilities in float64, stable for large logits: the evaluation's too (``tasks.metrics``
    imports it), so a rescored model's ranking metrics equal its recorded ones."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def classes(logits: np.ndarray, class_labels: np.ndarray, chosen: str, threshold=None):
    """A classifier's answer: ``predict_proba``'s class probabilities, a column per label, else the
    labels: a binary one's second where its probability is at least ``threshold``, else the likeliest."""
    import pandas as pd

    proba = softmax(logits) if len(logits) else np.empty((0, len(class_labels)))
    if chosen == "predict_proba":
        return pd.DataFrame(proba, columns=class_labels.tolist())
    if threshold is not None and proba.shape[1] == 2:
        return class_labels[(proba[:, 1] >= threshold).astype(np.int64)]
    return class_labels[proba.argmax(axis=1)]


def windows(doc: bytes, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, mask) int64/int64/bool ``[w, seq_len]`` covering every target of ``doc`` once (the lm task's
    rule: ``tasks/lm_eval.py``)."""
    arr = np.frombuffer(doc, dtype=np.uint8).astype(np.int64)
    n_targets = len(arr) - 1
    if n_targets <= 0:
        z = np.zeros((0, seq_len), dtype=np.int64)
        return z, z.copy(), np.zeros((0, seq_len), dtype=bool)
    if n_targets <= seq_len:
        x = np.zeros((1, seq_len), dtype=np.int64)
        y = np.zeros((1, seq_len), dtype=np.int64)
        x[0, :n_targets], y[0, :n_targets] = arr[:-1], arr[1:]
        mask = np.zeros((1, seq_len), dtype=bool)
        mask[0, :n_targets] = True
        return x, y, mask
    starts = list(range(0, n_targets - seq_len + 1, seq_len))
    covered = starts[-1] + seq_len
    if covered < n_targets:
        starts.append(n_targets - seq_len)
    xs = np.stack([arr[s : s + seq_len] for s in starts])
    ys = np.stack([arr[s + 1 : s + seq_len + 1] for s in starts])
    mask = np.ones_like(xs, dtype=bool)
    if covered < n_targets:
        mask[-1, : seq_len - (n_targets - covered)] = False  # scored by the previous window
    return xs, ys, mask


def score_documents(module, docs, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document (summed cross-entropy in nats, number of targets) under ``module`` (int64
    ``[batch, seq_len]`` tokens -> logits ``[batch, seq_len, vocab]``), in ``windows``."""
    import torch.nn.functional as F

    parts = [windows(d, seq_len) for d in docs]
    owner = np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])
    empty = np.zeros((0, seq_len), dtype=np.int64)
    x = np.concatenate([p[0] for p in parts] + [empty])
    y = np.concatenate([p[1] for p in parts] + [empty])
    mask = np.concatenate([p[2] for p in parts] + [empty.astype(bool)])
    nll = forward(lambda xb, yb: F.cross_entropy(module(xb).float().transpose(1, 2), yb, reduction="none"), x, y)
    per_window = (nll.reshape(mask.shape) * mask).sum(1)
    loss_sum = np.bincount(owner, weights=per_window, minlength=len(docs))
    n_tokens = np.bincount(owner, weights=mask.sum(1), minlength=len(docs)).astype(np.int64)
    return loss_sum, n_tokens


# A target nothing is learned from (torch's cross-entropy ``ignore_index``): the causal_lm task's.
IGNORE = -100


def token_ids(tok, text: str, special: bool) -> list[int]:
    return list(tok(text, add_special_tokens=special)["input_ids"])


def text_ids(tok, text: str) -> list[int]:
    """A text's tokens, ending with EOS."""
    ids = token_ids(tok, text, True)
    if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
        ids.append(tok.eos_token_id)
    return ids


def consecutive(ids: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """``ids`` cut into consecutive ``(inputs, next tokens)`` windows of at most ``max_length``."""
    return [(ids[s:s + n], ids[s + 1:s + n + 1]) for s in range(0, max(len(ids) - 1, 0), max_length)
            for n in [min(max_length, len(ids) - 1 - s)]]


def record_targets(tok, record: tuple[str, ...], max_length: int) -> list[tuple[list[int], list[int]]]:
    """One record as windows ``[(inputs, targets)]`` (``targets[t]``: the next token, IGNORE where not
    learned), each at most ``max_length`` long: a text's tokens + EOS in consecutive windows; a pair's
    prompt + completion + EOS in one window, targets on the completion only (no window: nothing learned)."""
    eos = tok.eos_token_id
    if len(record) == 1:
        return consecutive(text_ids(tok, record[0]), max_length)
    prompt = token_ids(tok, record[0], True)
    ids = (prompt + token_ids(tok, record[1], False) + ([eos] if eos is not None else []))[:max_length + 1]
    targets = [t if i + 1 >= len(prompt) else IGNORE for i, t in enumerate(ids[1:])]
    return [(ids[:-1], targets)] if any(t != IGNORE for t in targets) else []


def score_records(model, tok, records, max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-record (summed cross-entropy in nats, learned targets) under ``model`` (a transformers causal
    LM), in the windows of ``record_targets``, 16 padded windows a pass."""
    import torch
    import torch.nn.functional as F

    owner, parts = [], []
    for i, record in enumerate(records):
        for w in record_targets(tok, record, max_length):
            parts.append(w)
            owner.append(i)
    pad = tok.pad_token_id or 0

    def nll(part):
        t = max(len(x) for x, _ in part)
        ids = torch.full((len(part), t), pad, dtype=torch.long)
        mask = torch.zeros((len(part), t), dtype=torch.long)
        y = torch.full((len(part), t), IGNORE, dtype=torch.long)
        for j, (x, tg) in enumerate(part):
            ids[j, :len(x)], mask[j, :len(x)], y[j, :len(tg)] = torch.tensor(x), 1, torch.tensor(tg)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
        return F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE, reduction="none").sum(1)

    per_window = forward(nll, parts, rows=16)
    counts = np.asarray([sum(t != IGNORE for t in tg) for _, tg in parts], dtype=np.float64)
    owner_arr = np.asarray(owner, dtype=np.int64)
    loss_sum = np.bincount(owner_arr, weights=per_window, minlength=len(records))
    n_tokens = np.bincount(owner_arr, weights=counts, minlength=len(records))
    return loss_sum, n_tokens.astype(np.int64)


def scores(loss_sum: np.ndarray, n_tokens: np.ndarray) -> "pd.DataFrame":
    """A language model's answer per text: mean ``loss`` per target token (nats; NaN with none),
    ``perplexity`` and ``n_tokens``."""
    import pandas as pd

    with np.errstate(invalid="ignore", divide="ignore"):
        loss = np.where(n_tokens > 0, loss_sum / np.maximum(n_tokens, 1), np.nan)
    return pd.DataFrame({"loss": loss, "perplexity": np.exp(loss), "n_tokens": n_tokens})
