"""Steps that ``prefect deploy`` runs from a prefect file's ``build:`` sections (never on a worker)."""

from __future__ import annotations

import os
import sys


def require_env(deployment: str, names: list[str]) -> dict:
    """Stop ``prefect deploy`` of ``deployment`` (one line on stderr, exit 1) unless every one of ``names``
    is set and non-blank: for an unset ``{{ $VAR }}`` Prefect stores the placeholder's literal text, and
    the deployment would fail later on a worker. SystemExit: Prefect wraps a step's exception in two
    tracebacks."""
    if gone := [n for n in names if not os.environ.get(n, "").strip()]:
        placeholders = ", ".join("{{ $" + n + " }}" for n in gone)
        print(f"error: prefect deploy {deployment}: {', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not set "
              f"(the deployment's {placeholders}); export {'it' if len(gone) == 1 else 'them'} and deploy again",
              file=sys.stderr, flush=True)
        raise SystemExit(1)
    return {}
