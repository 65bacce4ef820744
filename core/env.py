"""Process environment for offline, telemetry-free runs (entry points call ``apply_offline_env``)."""

from __future__ import annotations

import os
from pathlib import Path

# Values each tool actually accepts (MLflow ignores "1").
TELEMETRY_OFF = {
    "DO_NOT_TRACK": "true", "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1", "HF_HUB_OFFLINE": "1",
    # Git metadata lookups in MLflow must not hang or warn on a missing binary.
    "GIT_PYTHON_REFRESH": "quiet", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def offline_env(home: Path) -> dict[str, str]:
    """Variables a trainflow process (and its children) should run with."""
    # A first ephemeral start creates the database: Prefect's 20 s default is too short on a busy machine.
    return {**TELEMETRY_OFF, "PREFECT_HOME": str(home / "prefect"), "PREFECT_LOGGING_LEVEL": "INFO",
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120", "PREFECT_UI_ENABLED": "false"}


def apply_offline_env(home: Path) -> None:
    """Set the offline variables in this process, keeping any the user already set; create PREFECT_HOME."""
    for key, value in offline_env(home).items():
        os.environ.setdefault(key, value)
    # Prefect's ephemeral server creates its sqlite file there, but not the folder.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
