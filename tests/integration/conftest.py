"""Integration fixtures: one real Prefect API for the session, real DVC projects on demand."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from tests.conftest import VENV_BIN


@pytest.fixture(scope="session")
def prefect_api():
    """One temporary Prefect server (real engine, real database) shared by the tests that run flows.

    A server per test would pay 7-17 s each; the start-up timeout is generous because
    a busy 2-core CI box can take over 20 s to start it the first time.
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def clean_env():
    """Restore os.environ after a test that runs the CLI in-process (it sets offline defaults)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, **kw)


@pytest.fixture
def make_project(tmp_path, repo_root, bundled_data) -> Callable[..., Path]:
    """A real git + DVC project holding a (possibly mutated) copy of the bundled data.

    ``mutate(train_df, test_df)`` edits pandas frames in place before ``dvc add``.
    """

    def build(mutate=None, name: str = "proj") -> Path:
        import pandas as pd

        proj = tmp_path / name
        (proj / "configs").mkdir(parents=True)
        shutil.copy(repo_root / "configs" / "digits.yaml", proj / "configs" / "digits.yaml")
        data = proj / "data" / "digits"
        data.mkdir(parents=True)
        train = pd.read_csv(bundled_data / "train.csv")
        test = pd.read_csv(bundled_data / "test.csv")
        if mutate:
            mutate(train, test)
        train.to_csv(data / "train.csv", index=False)
        test.to_csv(data / "test.csv", index=False)
        run(["git", "init", "-q"], proj)
        dvc = str(VENV_BIN / "dvc")
        run([dvc, "init", "-q"], proj)
        run([dvc, "config", "core.analytics", "false"], proj)
        run([dvc, "add", "-q", "data"], proj)
        run(["git", "add", "-A"], proj)
        run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "data"], proj)
        return proj

    return build
