"""The ``causal_lm`` task's data: JSON Lines records tokenized with the model folder's own tokenizer.

A record is ``{"text": ...}`` (``pretrained.text_column``), or a ``prompt`` + ``completion`` pair
(``pretrained.prompt_column`` / ``completion_column``, both set). Files are ``dataset.text``'s:
``train_file`` (minus a seeded ``holdout_fraction`` of its records: the per-epoch validation) and
``eval_file`` (the gate's split).

A training sample is ``x`` int64 ``[2, max_length]`` (row 0 token ids, row 1 the attention mask) and
``y`` int64 ``[max_length]``: the next token at each position, ``IGNORE`` where nothing is learned.

- ``text``: every document's tokens, then EOS, concatenated and cut into sequences of ``max_length``
  inputs (consecutive sequences share one token: the last input of one is the first target of the
  next's window); the tail is padded and masked.
- pairs: one pair per sequence, ``prompt + completion + EOS`` cut to ``max_length + 1`` tokens; the
  targets are the completion's tokens (and EOS) only; a pair whose prompt leaves no completion token
  is dropped, counted in the log.

The scores (``record_targets``, in ``tasks.pyfunc_common``) use the same rules per record; the
evaluation and the registered pyfunc's ``score`` both run that code.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from core.errors import DataUnavailableError
from tasks.pyfunc_common import IGNORE, consecutive, record_targets, text_ids
from tasks.text import read_records  # noqa: F401 - the records' reader, here too

# Bump when the tokenized arrays change meaning: older cache files are then never read.
CACHE_VERSION = 1
log = logging.getLogger("trainflow.train")


def columns(cfg) -> tuple[str, ...]:
    """The record keys the config reads: ``(text,)`` or ``(prompt, completion)``."""
    p = cfg.pretrained
    if p.prompt_column and p.completion_column:
        return (p.prompt_column, p.completion_column)
    return (p.text_column,)


def pack_text(tok, records: list[tuple[str, ...]], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``text`` records packed into ``(x [n, 2, L], y [n, L])`` (see the module's docstring)."""
    stream = [t for (text,) in records for t in text_ids(tok, text)]
    return _padded(consecutive(stream, max_length), max_length, tok.pad_token_id)


def pairs(tok, records: list[tuple[str, ...]], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """prompt + completion records, one per sequence (see the module's docstring)."""
    windows = [w for r in records for w in record_targets(tok, r, max_length)]
    if len(windows) < len(records):
        log.warning("causal_lm: %d of %d prompt/completion records dropped: the prompt fills all %d tokens",
                    len(records) - len(windows), len(records), max_length)
    return _padded(windows, max_length, tok.pad_token_id)


def _padded(windows, max_length: int, pad: int | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.zeros((len(windows), 2, max_length), dtype=np.int64)
    x[:, 0] = pad or 0
    y = np.full((len(windows), max_length), IGNORE, dtype=np.int64)
    for i, (inputs, targets) in enumerate(windows):
        n = len(targets)
        x[i, 0, :n], x[i, 1, :n], y[i, :n] = inputs[:n], 1, targets
    return x, y


def tokenized(cfg, root: Path, seed: int, folder: Path) -> dict[str, np.ndarray]:
    """``{x_train, y_train, x_val, y_val, x_test, y_test}``: the splits tokenized by ``folder``'s tokenizer,
    cached in ``TRAINFLOW_HOME/cache/causal_lm`` by the files' and the tokenizer's bytes and every
    setting that shapes them (an ``.npz`` read without pickle). Each rank reads or makes its own."""
    from core.hashing import file_sha256, sha256_json
    from core.paths import trainflow_home
    from tasks.base import cache_write
    from tasks.text import corpus_files, holdout_documents

    text, p = cfg.dataset.text, cfg.pretrained
    files = corpus_files(cfg, root)
    keys = columns(cfg)
    try:
        tok_files = {f.name: file_sha256(f) for f in sorted(Path(folder).iterdir())
                     if f.is_file() and f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))}
        key = {"files": {k: file_sha256(f) for k, f in files.items()}, "tokenizer": tok_files, "keys": keys,
               "max_length": p.max_length, "holdout": text.holdout_fraction, "seed": seed, "v": CACHE_VERSION}
    except OSError as exc:
        raise DataUnavailableError(f"cannot read {exc.filename}: {exc.strerror}; run `dvc pull`") from None
    path = trainflow_home(Path(root)) / "cache" / "causal_lm" / f"{sha256_json(key)[:32]}.npz"
    try:
        with np.load(path, allow_pickle=False) as cached:
            return {k: cached[k] for k in cached.files}
    except (OSError, ValueError, KeyError):
        pass
    from tasks.hf_folder import load_tokenizer

    tok = load_tokenizer(folder)
    build = pairs if len(keys) == 2 else pack_text
    train = read_records(files["train"], keys)
    keep, hold = holdout_documents(len(train), text.holdout_fraction, seed)
    out = {}
    for split, records in (("train", [train[i] for i in keep]), ("val", [train[i] for i in hold]),
                           ("test", read_records(files["eval"], keys))):
        out[f"x_{split}"], out[f"y_{split}"] = build(tok, records, p.max_length)
    cache_write(path, lambda fh: np.savez(fh, **out))
    return out
