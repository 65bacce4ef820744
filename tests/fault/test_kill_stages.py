"""SIGKILL of ``trainflow run`` during validation and during registration (a version created, the
aliases not yet set): no process of it lives on, no version is left without its recorded hashes,
no ``@champion`` is set by the killed runs, and the next run registers the champion. The kill
during training: tests/fault/test_orphans.py.

The moment of each kill is read from outside, as a user would see it: the CLI's own log line that
``resolve`` finished (validation starts next), and the model version's row in the run's sqlite
registry (written by ``register``, before ``@challenger`` and the promotion)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN
from tests.integration.live import marked_processes
from tests.waiting import wait_for

pytestmark = pytest.mark.fault

MARK = "TRAINFLOW_TEST_RUN_MARK"
CONFIG = "tests/configs/team.yaml"  # digits, three epochs clear its gates
MODEL = "digits-classifier"


def _start(repo_root: Path, home: Path, tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    marker = uuid.uuid4().hex
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(tmp / "prefect"), MARK: marker}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "TRAINFLOW_FAULT"):
        env.pop(name, None)
    log = tmp / f"run-{marker}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(VENV_BIN / "trainflow"), "run", "--config", CONFIG, "--summary-json",
                                 str(tmp / f"summary-{marker}.json")], cwd=repo_root, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return proc, marker, log


def _versions(home: Path) -> list[tuple[str, dict]]:
    """(version, tags) of every version of MODEL in the run's registry, read without MLflow."""
    db = home / "mlflow.db"
    if not db.is_file():
        return []
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        try:
            rows = conn.execute("SELECT version FROM model_versions WHERE name = ?", (MODEL,)).fetchall()
            tags = conn.execute("SELECT version, key, value FROM model_version_tags WHERE name = ?",
                                (MODEL,)).fetchall()
        except sqlite3.OperationalError:  # tables not made yet, or the database busy for a moment
            return []
    return [(str(v), {k: val for ver, k, val in tags if ver == v}) for (v,) in rows]


def _aliases(home: Path) -> dict[str, str]:
    db = home / "mlflow.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
        return {a: str(v) for a, v in conn.execute(
            "SELECT alias, version FROM registered_model_aliases WHERE name = ?", (MODEL,)).fetchall()}


def _kill_when(proc: subprocess.Popen, log: Path, ready, what: str, timeout: float = 300) -> None:
    def seen() -> bool:
        assert proc.poll() is None, f"the run ended before {what}"
        return ready()

    try:
        wait_for(seen, timeout, what, poll_s=0.01)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-3000:]}") from None
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _gone(marker: str, within: float = 30) -> dict[int, str]:
    with contextlib.suppress(AssertionError):  # the caller names what is left
        wait_for(lambda: not marked_processes(MARK, marker), within, "the killed run's processes to end", poll_s=0.2)
    left = marked_processes(MARK, marker)
    for pid in left:  # only ever needed where the run left orphans behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


@pytest.fixture(scope="module")
def killed(repo_root, bundled_data, tmp_path_factory) -> dict:
    """One TRAINFLOW_HOME, two runs SIGKILLed in it: during validation, then during registration."""
    tmp = tmp_path_factory.mktemp("kill-stages")
    home, seen = tmp / "home", {}

    # During validation: `resolve` has finished, so `validate` runs now.
    proc, marker, log = _start(repo_root, home, tmp)
    _kill_when(proc, log, lambda: re.search(r"Task run 'resolve-\w+' - Finished in state Completed", log.read_text()),
               "the end of resolve")
    seen["validation"] = {"validated": bool(re.search(r"Task run 'validate-\w+' - Finished", log.read_text())),
                          "left": _gone(marker), "versions": _versions(home),
                          "trained": list(home.glob("train/*/result.json"))}

    # During registration: the version exists, its aliases are not set yet.
    proc, marker, log = _start(repo_root, home, tmp)
    _kill_when(proc, log, lambda: bool(_versions(home)), "model version")
    seen["registration"] = {"left": _gone(marker), "versions": _versions(home), "aliases": _aliases(home)}
    return {"tmp": tmp, "home": home, **seen}


def test_sigkill_during_validation_leaves_no_process_and_nothing_trained_or_registered(killed):
    seen = killed["validation"]
    assert not seen["validated"], "the kill came after validation: nothing tested"
    assert seen["left"] == {}, "a process of the run killed in validation outlived it"
    assert seen["versions"] == [] and seen["trained"] == []


def test_sigkill_during_registration_leaves_no_process_no_version_without_hashes_and_no_champion(killed):
    seen = killed["registration"]
    assert seen["left"] == {}, "a process of the run killed in registration outlived it"
    assert [v for v, _ in seen["versions"]] == ["1"]
    for _, tags in seen["versions"]:  # the hashes are written with the version, never after it
        assert "trainflow.sha256/MLmodel" in tags and "trainflow.sha256/artifacts/model.pt2" in tags, tags
    assert "champion" not in seen["aliases"]


def test_the_next_run_after_the_kills_registers_the_champion(killed, repo_root):
    home, tmp = killed["home"], killed["tmp"]
    proc, marker, log = _start(repo_root, home, tmp)
    assert proc.wait(timeout=480) == 0, log.read_text()[-3000:]
    summary = json.loads((tmp / f"summary-{marker}.json").read_text())
    assert summary["status"] == "registered" and "champion" in summary["aliases"]
    assert _aliases(home)["champion"] == summary["model_version"]
    assert _gone(marker, within=10) == {}
    # The killed runs' MLflow runs do not stay RUNNING: the next run on the home marked each KILLED.
    with sqlite3.connect(f"file:{home / 'mlflow.db'}?mode=ro", uri=True, timeout=5) as conn:
        status = dict(conn.execute("SELECT run_uuid, status FROM runs").fetchall())
        orphaned = dict(conn.execute("SELECT run_uuid, value FROM tags WHERE key = 'trainflow.orphaned'").fetchall())
    assert status.pop(summary["mlflow_run_id"]) == "FINISHED"
    assert sorted(status.values()) == ["KILLED", "KILLED"], status
    assert set(orphaned) == set(status) and all("is gone" in why for why in orphaned.values()), orphaned
