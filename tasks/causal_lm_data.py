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

The scores (``record_targets``) use the same rules per record, so the evaluation's figures and the
registered pyfunc's ``score`` agree (``tasks/pyfunc_causal.py`` keeps a copy; a test holds them equal).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from core.errors import DataUnavailableError
from tasks.text import read_records  # noqa: F401 - the records' reader, here too

IGNORE = -100
# Bump when the tokenized arrays change meaning: older cache files are then never read.
CACHE_VERSION = 1
log = logging.getLogger("trainflow.train")


def columns(cfg) -> tuple[str, ...]:
    """The record keys the config reads: ``(text,)`` or ``(prompt, completion)``."""
    p = cfg.pretrained
    if p.prompt_column and p.completion_column:
        return (p.prompt_column, p.completion_column)
    return (p.text_column,)


def _ids(tok, text: str, special: bool) -> list[int]:
    return list(tok(text, add_special_tokens=special)["input_ids"])


def _text_ids(tok, text: str) -> list[int]:
    """A text's tokens, ending with EOS."""
    ids = _ids(tok, text, True)
    if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
        ids.append(tok.eos_token_id)
    return ids


def _consecutive(ids: list[int], max_length: int) -> list[tuple[list[int], list[int]]]:
    """``ids`` cut into consecutive ``(inputs, next tokens)`` windows of at most ``max_length``."""
    return [(ids[s:s + n], ids[s + 1:s + n + 1]) for s in range(0, max(len(ids) - 1, 0), max_length)
            for n in [min(max_length, len(ids) - 1 - s)]]


def record_targets(tok, record: tuple[str, ...], max_length: int) -> list[tuple[list[int], list[int]]]:
    """One record as windows ``[(inputs, targets)]`` (``targets[t]``: the next token, IGNORE where not
    learned), each at most ``max_length`` long: a text's tokens + EOS in consecutive windows; a pair's
    prompt + completion + EOS in one window, targets on the completion only (no window: nothing learned)."""
    eos = tok.eos_token_id
    if len(record) == 1:
        return _consecutive(_text_ids(tok, record[0]), max_length)
    prompt = _ids(tok, record[0], True)
    ids = (prompt + _ids(tok, record[1], False) + ([eos] if eos is not None else []))[:max_length + 1]
    targets = [t if i + 1 >= len(prompt) else IGNORE for i, t in enumerate(ids[1:])]
    return [(ids[:-1], targets)] if any(t != IGNORE for t in targets) else []


def pack_text(tok, records: list[tuple[str, ...]], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """``text`` records packed into ``(x [n, 2, L], y [n, L])`` (see the module's docstring)."""
    stream = [t for (text,) in records for t in _text_ids(tok, text)]
    return _padded(_consecutive(stream, max_length), max_length, tok.pad_token_id)


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
