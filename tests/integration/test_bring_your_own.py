"""Bring your own data and model, end to end through the real flow (Prefect, DVC, GX, torchrun
with 2 CPU processes, MLflow on sqlite), each in a fresh git + DVC project:

* the README's "Bring your own data and model" commands, run literally: wine, one CSV with
  named float columns and string labels, from ``trainflow init`` to a registered champion that
  ``mlflow.pyfunc`` scores on a DataFrame with the original column names;
* tables shaped like users' (text, gaps, ids, a regression with given splits, 50,000 rows) and a
  user's table that breaks its reviewed expectations: tests/integration/test_real_tables.py.

The example package's own task (entry point ``trainflow.tasks``) through the whole flow, in a
fresh project too, is tests/integration/test_example_task.py's ``flow_run``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, VENV_BIN
from tests.integration.conftest import DVC_BIN, GIT_ID, run

# One Prefect server for the module's runs (the session's): each run in a fresh project would
# otherwise boot its own temporary server on a new database (migrations and all). The default
# path, a temporary server per run, is tested in test_api_server.py.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
# A hung job fails the test in minutes.
BOUNDS = ["--set", "training.timeout_s=240", "--set", "training.collective_timeout_s=60"]


def _env() -> dict:
    from prefect.settings import PREFECT_API_URL

    env = {k: v for k, v in os.environ.items() if k not in ("TRAINFLOW_HOME", "MLFLOW_TRACKING_URI",
                                                             "MLFLOW_REGISTRY_URI", "PREFECT_API_URL")}
    return {**env, **GIT_ENV, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "PREFECT_API_URL": PREFECT_API_URL.value()}


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A fresh git + DVC repository, as a user's clone of their own project would be; made once
    (git and dvc init cost seconds), each test gets its own copy (``project``)."""
    proj = tmp_path_factory.mktemp("byo-template") / "proj"
    (proj / "data").mkdir(parents=True)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    (proj / ".gitignore").write_text(".trainflow/\n.venv\n")
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", "init"], proj)
    return proj


@pytest.fixture
def project(template, tmp_path) -> Path:
    """A copy of the template repository of its own (nothing in .git or .dvc names the folder)."""
    proj = tmp_path / "proj"
    shutil.copytree(template, proj, symlinks=True)
    return proj


def trainflow(proj: Path, *args: str, timeout: float = 400, env: dict | None = None) -> tuple[int, dict, str]:
    """``trainflow ARGS --summary-json`` in ``proj``: (exit code, summary, stderr)."""
    summary = proj / ".summary.json"
    summary.unlink(missing_ok=True)
    done = subprocess.run([str(VENV_BIN / "trainflow"), *args, "--summary-json", str(summary)], cwd=proj,
                          env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)
    return done.returncode, (json.loads(summary.read_text()) if summary.is_file() else {}), done.stderr


SCORE = """
import json, sys
import mlflow, numpy as np, pandas as pd
from core.config import load_config
from core.paths import default_tracking_uri
from pathlib import Path
from tasks.table import load_frames
proj, config, model = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
cfg = load_config(proj / config)
test = load_frames(cfg.dataset, proj, cfg.seed, cfg.task == "classification")["test"]
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
pred = loaded.predict(test.drop(columns=[cfg.dataset.label]))
print(json.dumps({"pred": np.asarray(pred).tolist(), "truth": test[cfg.dataset.label].tolist(),
                  "inputs": [[c.name, c.type.name] for c in loaded.metadata.get_input_schema().inputs],
                  "output": loaded.metadata.get_output_schema().inputs[0].type.name}))
"""


def pyfunc_scores(proj: Path, config: str, model: str) -> dict:
    """The champion, loaded through ``mlflow.pyfunc`` in a fresh process, predicting the config's
    test split from a DataFrame of the original columns."""
    done = subprocess.run([sys.executable, "-c", SCORE, str(proj), config, model], cwd=proj, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- byo:start", 1)[1].split("<!-- byo:end -->", 1)[0]
    code = block.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_commands_take_a_csv_from_init_to_a_champion_scored_through_pyfunc(project):
    (project / ".venv").symlink_to(VENV_BIN.parent)
    (project / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "export_wine.py", project / "scripts" / "export_wine.py")
    commands = readme_commands()
    assert any(c.startswith("trainflow init") for c in commands) and commands[-1].startswith("trainflow run")
    script = "set -euo pipefail\n" + "\n".join(commands)
    done = subprocess.run(["bash", "-c", script], cwd=project, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    assert "trainflow: registered" in done.stderr
    scores = pyfunc_scores(project, "configs/mywine.yaml", "mywine")
    # 13 named float columns in, as the CSV types them; the original string labels out.
    assert scores["inputs"][0] == ["alcohol", "double"] and len(scores["inputs"]) == 13
    assert scores["output"] == "string" and set(scores["pred"]) <= {"class_0", "class_1", "class_2"}
    accuracy = float(np.mean(np.asarray(scores["pred"]) == np.asarray(scores["truth"])))
    assert accuracy >= 0.95, accuracy


def commit_all(proj: Path, message: str) -> None:
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", message], proj)
