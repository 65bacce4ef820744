"""Steps that ``prefect deploy`` runs from a prefect file's ``build:`` sections (never on a worker).

Prefect fills ``{{ $VAR }}`` from the environment of ``prefect deploy`` and, when ``VAR`` is
unset, stores the placeholder's literal text (pull steps, job variables) or an empty string
(build steps). The deployment is created all the same and fails later on a worker, e.g.
``git clone '{{ $TRAINFLOW_GIT_REPO }}'``. ``require_env``, the build step of each deployment
with such placeholders, stops ``prefect deploy`` before anything is stored on the server.
"""

from __future__ import annotations

import os
import sys


def missing(names: list[str]) -> list[str]:
    """Those of ``names`` that are unset or blank in this environment, in order."""
    return [n for n in names if not os.environ.get(n, "").strip()]


def require_env(deployment: str, names: list[str]) -> dict:
    """Stop ``prefect deploy`` of ``deployment`` unless every one of ``names`` is set and non-blank.

    Writes one line naming the deployment and the variables to stderr and exits 1. SystemExit,
    not an exception: Prefect 3.9 wraps a step's exception in two tracebacks ending in
    "Encountered error while running ...", and lets SystemExit through as the exit code.
    """
    gone = missing(names)
    if gone:
        placeholders = ", ".join("{{ $" + n + " }}" for n in gone)
        print(f"error: prefect deploy {deployment}: {', '.join(gone)} {'is' if len(gone) == 1 else 'are'} not set "
              f"(the deployment's {placeholders}); export {'it' if len(gone) == 1 else 'them'} and deploy again",
              file=sys.stderr, flush=True)
        raise SystemExit(1)
    return {}
