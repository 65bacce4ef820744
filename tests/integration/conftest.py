"""Integration fixtures: one real Prefect API for the session, real DVC projects on demand."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
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


def shared_temp(tmp_path_factory) -> Path:
    """A folder every test process of this session sees: the base temp, or its parent under
    pytest-xdist (each worker gets ``<base>/popen-gwN``)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def cli_run(repo_root, bundled_data, tmp_path_factory) -> SimpleNamespace:
    """One ``trainflow run`` as a user types it (``make run``'s path): a subprocess with no
    PREFECT_API_URL, so it starts its own temporary Prefect API server, and a fresh TRAINFLOW_HOME
    and PREFECT_HOME under ``root``. Shared by the tests that look at what such a run leaves
    (test_api_server, test_ui, test_launch); ``summary`` is its --summary-json.

    Run once per session: under pytest-xdist the first process to ask runs it (under a file lock)
    and the others read what it recorded."""
    from filelock import FileLock

    shared = shared_temp(tmp_path_factory)
    root, record = shared / "cli-run", shared / "cli-run.json"
    with FileLock(str(shared / "cli-run.lock")):
        if not record.is_file():
            root.mkdir()
            env = {**os.environ, "PREFECT_HOME": str(root / "prefect"), "TRAINFLOW_HOME": str(root / "home")}
            for key in ("PREFECT_API_URL", "PREFECT_UI_URL", "MLFLOW_TRACKING_URI",
                        "PREFECT_API_DATABASE_CONNECTION_URL", "PYTEST_XDIST_WORKER"):
                env.pop(key, None)
            out = root / "summary.json"
            # What the `trainflow` script runs (flows.cli:main), plus one line at exit: whether this
            # process imported torch (test_launch: a classifier run leaves torch to the workers).
            code = ("import sys; from flows.cli import main; code = main(sys.argv[1:]);"
                    "print('TORCH_IMPORTED', 'torch' in sys.modules); sys.exit(code)")
            proc = subprocess.run([str(VENV_BIN / "python"), "-c", code, "run", "--config", "tests/configs/digits-quick.yaml",
                                   "--summary-json", str(out)],
                                  cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
            record.write_text(json.dumps({"env": env, "args": proc.args, "returncode": proc.returncode,
                                          "stdout": proc.stdout, "stderr": proc.stderr,
                                          "summary": json.loads(out.read_text()) if out.is_file() else None}))
    got = json.loads(record.read_text())
    proc = subprocess.CompletedProcess(got["args"], got["returncode"], got["stdout"], got["stderr"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return SimpleNamespace(root=root, env=got["env"], proc=proc, summary=got["summary"])


@pytest.fixture
def clean_env():
    """Restore os.environ after a test that runs the CLI in-process (it sets offline defaults)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True, **kw)


DVC_BIN = str(VENV_BIN / "dvc")
GIT_ID = ["-c", "user.email=t@t", "-c", "user.name=t"]
# The packages a project needs to train with its own code (see ``build_project(with_code=True)``).
CODE_DIRS = ("core", "flows", "tasks", "training", "validation", "evaluation", "registry")


def build_project(proj: Path, repo_root: Path, bundled_data: Path, mutate=None, with_code: bool = False) -> Path:
    """A real git + DVC project at ``proj`` holding a (possibly mutated) copy of the bundled data.

    ``mutate(train_df, test_df)`` edits pandas frames in place before ``dvc add``. With
    ``with_code`` the project also commits a copy of this checkout's packages, so a commit of
    it names the code that trains (what ``reproduce`` restores).
    """
    import pandas as pd

    (proj / "configs").mkdir(parents=True)
    for name in ("digits.yaml", "digits.expectations.yaml"):
        shutil.copy(repo_root / "configs" / name, proj / "configs" / name)
    # The test configs (tests/configs/*.yaml extend ../../configs/digits.yaml: this copy's).
    shutil.copytree(repo_root / "tests" / "configs", proj / "tests" / "configs")
    if with_code:
        for name in CODE_DIRS:
            shutil.copytree(repo_root / name, proj / name, ignore=shutil.ignore_patterns("__pycache__"))
    data = proj / "data" / "digits"
    data.mkdir(parents=True)
    train = pd.read_csv(bundled_data / "train.csv")
    test = pd.read_csv(bundled_data / "test.csv")
    if mutate:
        mutate(train, test)
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    # One .dvc per dataset folder (data/digits.dvc: configs/digits.yaml's dataset.dvc_file), so
    # another dataset under data/ can be added beside it. DVC git-ignores the folder in data/.gitignore.
    run([DVC_BIN, "add", "-q", "data/digits"], proj)
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", "data"], proj)
    return proj


def commit_data(proj: Path, mutate, message: str = "new data") -> str:
    """Rewrite the project's data with ``mutate(train_df, test_df)``, ``dvc add`` and commit it.
    Returns the new data md5."""
    import pandas as pd
    import yaml

    data = proj / "data" / "digits"
    train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
    mutate(train, test)
    train.to_csv(data / "train.csv", index=False)
    test.to_csv(data / "test.csv", index=False)
    run([DVC_BIN, "add", "-q", "data/digits"], proj)
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", message], proj)
    return yaml.safe_load((proj / "data" / "digits.dvc").read_text())["outs"][0]["md5"]


@pytest.fixture
def make_project(tmp_path, repo_root, bundled_data) -> Callable[..., Path]:
    """A real git + DVC project holding a (possibly mutated) copy of the bundled data.

    ``mutate(train_df, test_df)`` edits pandas frames in place before ``dvc add``.
    """

    def build(mutate=None, name: str = "proj", with_code: bool = False) -> Path:
        return build_project(tmp_path / name, repo_root, bundled_data, mutate, with_code)

    return build


@pytest.fixture(scope="module")
def mlflow_env(tmp_path_factory):
    """Telemetry off and no outside MLflow settings; undo the global URIs afterwards.

    ``mlflow.set_tracking_uri`` / ``set_registry_uri`` also export
    MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI, so the env is put back too.
    """
    root = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DO_NOT_TRACK", "true")
        mp.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        mp.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        mp.setenv("GIT_PYTHON_REFRESH", "quiet")
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "MLFLOW_EXPERIMENT_ID",
                     "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
            mp.delenv(name, raising=False)
        # A stray relative ./mlruns would land here, where a test can look for it.
        cwd = root / "cwd"
        cwd.mkdir()
        mp.chdir(cwd)
        yield root
        import mlflow

        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node Slurm (``n1``, ``n2``) on loopback for the session (tests/slurm_cluster.py);
    skips where its programs are missing."""
    from tests import slurm_cluster as cluster

    if gaps := cluster.missing():
        pytest.skip(f"Slurm tests need {', '.join(gaps)}: {cluster.ENABLE}")
    with cluster.slurm_cluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running
