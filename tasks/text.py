"""A text corpus as JSON Lines (``{"path": ..., "text": ...}`` per line), torch-free."""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import DataUnavailableError


def read_documents(path: Path) -> list[tuple[str, bytes]]:
    """``[(doc path, UTF-8 bytes)]`` from a JSON Lines corpus file, in file order.

    Raises DataUnavailableError when the file is missing or a line is not a
    ``{"path", "text"}`` object (the validation suite reports content problems in detail).
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise DataUnavailableError(f"cannot read {path}: {exc.strerror}; run `dvc pull`") from None
    docs = []
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            docs.append((str(obj["path"]), obj["text"].encode("utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataUnavailableError(f"{path}:{i}: not a JSON object with string 'path' and 'text' "
                                       f"({type(exc).__name__}: {exc})") from None
    return docs
