"""Steps that ``prefect deploy`` runs from a prefect file's ``build:`` sections (never on a worker).

For an unset ``{{ $VAR }}`` Prefect stores the placeholder's literal text, and the deployment fails later
on a worker (``git clone '{{ $TRAINFLOW_GIT_REPO }}'``); ``require_env`` stops ``prefect deploy`` first.
"""

from __future__ import annotations

import os
import sys


def missing(names: list[str]) -> list[str]:
    """Those of ``names`` that are unset or blank in this environment, in order."""
    return [n for n in names if not os.environ.get(n, "").strip()]


def require_env(deployment: str, names: list[str]) -> dict:
    """Stop ``prefect deploy`` of ``deployment`` (one line on stderr, exit 1) unless every one of ``names``
    is set and non-blank. SystemExit: Prefect wraps a step's exception in two tracebacks."""
    if gone := missing(names):
        placeholders = ", ".join("{{ $" + n + " }}" for n in gone)
        print(f"error: prefect deploy {deployment}: {', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not set "
              f"(the deployment's {placeholders}); export {'it' if len(gone) == 1 else 'them'} and deploy again",
              file=sys.stderr, flush=True)
        raise SystemExit(1)
    return {}
