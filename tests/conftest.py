"""Shared fixtures. Telemetry is off for the whole test process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tasks  # noqa: F401 - the tasks' config options join core.config's schema
from core.env import TELEMETRY_OFF

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def load_script(name: str):
    """``scripts/<name>.py`` loaded as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"trainflow_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    os.environ.update(TELEMETRY_OFF)


def pytest_collection_modifyitems(config, items):
    """The image test last: under `make test` (IMAGE_TEST=1, the default) its build runs beside the
    suite, so by then it is done (and with xdist's loadfile a worker is not held waiting for it while
    other files are queued)."""
    items.sort(key=lambda item: item.get_closest_marker("image") is not None)  # stable: else in order


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def bundled_data(repo_root) -> Path:
    """The bundled digits split (and the digit images), pulled with real DVC when the workspace lacks them."""
    folder = repo_root / "data" / "digits"
    if not (folder / "train.csv").is_file() or not (repo_root / "data" / "digit-images" / "train").is_dir():
        subprocess.run([str(VENV_BIN / "dvc"), "pull", "-q"], cwd=repo_root, check=True)
    return folder
