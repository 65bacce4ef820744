"""The Makefile as a newcomer meets it, run by real make: `make data` keeps DVC's errors and drops
only its no-default-remote line; a first `make install` says what each phase does."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def _fake_dvc(tmp_path: Path, stderr: str, code: int) -> Path:
    """A venv whose ``dvc`` prints ``stderr`` and a summary on stdout, and exits ``code``; installed
    (its stamp is newer than what it depends on), so `make data` runs only the pull."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    dvc = venv / "bin" / "dvc"
    dvc.write_text(f"#!/bin/bash\necho \"$*\" > {tmp_path}/args\necho 'Everything is up to date.'\n"
                   f"printf '%s' '{stderr}' >&2\nexit {code}\n")
    dvc.chmod(0o755)
    (venv / ".trainflow-installed").touch()
    return venv


def test_make_data_drops_only_dvcs_no_default_remote_line_and_keeps_its_errors(tmp_path):
    """The bundled .dvc files name their remote; DVC still says it has no default one on every pull."""
    env = {**os.environ, "MAKEFLAGS": ""}
    warning = "No remote provided and no default remote set.\n"
    venv = _fake_dvc(tmp_path, warning, 0)
    done = subprocess.run(["make", "-s", "data", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert (tmp_path / "args").read_text().split() == ["pull"]  # not -q: that hides DVC's errors too
    error = "ERROR: failed to pull data from the cloud - Checkout failed for following targets:\ndata/digits\n"
    venv = _fake_dvc(tmp_path / "failing", "WARNING: missing cache files\n" + warning + error + warning, 1)
    done = subprocess.run(["make", "-s", "data", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.startswith("WARNING: missing cache files\n" + error)
    assert "No remote provided" not in done.stderr


def test_first_install_says_what_it_is_doing():
    """`make install` on a fresh clone: one line per phase; pip's own progress only on a terminal."""
    env = {**os.environ, "MAKEFLAGS": ""}
    dry = subprocess.run(["make", "-n", "-B", "install", "VENV=/nonexistent/venv"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    phases = re.findall(r'echo "trainflow: \[(\d)/(\d)\] ([^"]+)"', dry)
    assert [(int(i), int(n)) for i, n, _ in phases] == [(i, 4) for i in range(1, 5)], dry
    assert "creating /nonexistent/venv/" in phases[0][2] and "minutes" in phases[1][2]
    installs = [line for line in dry.splitlines() if "pip install" in line]
    assert installs and all("test -t 1" in line for line in installs), installs  # -q only off a terminal
