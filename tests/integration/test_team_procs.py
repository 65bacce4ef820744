"""scripts/team.py's `down` with real processes: it signals only the processes `up` started (a
reused pid is left alone) and ends their whole group; `up`'s exports, evaluated by a real shell,
set the credentials from the owner-only file without printing them. (Without processes:
tests/unit/test_team.py; the servers themselves: tests/integration/test_team_mode.py.)"""

from __future__ import annotations

import json
import subprocess

import pytest

from core.procs import group_members
from tests.conftest import load_script
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def team():
    return load_script("team")


@pytest.fixture
def bystander():
    """An unrelated live process that leads its own process group, as a server (or anyone's shell) does."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _stale_state(team_dir, pid, identity=None):
    team_dir.mkdir()
    state = {"dir": str(team_dir), "pids": {"mlflow": pid, "prefect": pid}, "pg": None,
             "mlflow_url": "http://127.0.0.1:5000", "prefect_api_url": "http://127.0.0.1:4200/api"}
    if identity is not None:
        state["identity"] = {"mlflow": identity, "prefect": identity}
    (team_dir / "team.json").write_text(json.dumps(state))


@pytest.mark.parametrize("record", ["none", "other_start", "other_cmdline"])
def test_down_with_stale_team_json_leaves_an_unrelated_live_pid_alive(team, bystander, tmp_path, capsys, record):
    # none: a team.json without start times (as team.py wrote before); other_*: the pid was reused.
    identity = None
    if record != "none":
        identity = team.proc_identity(bystander.pid)
        if record == "other_start":
            identity["start"] -= 1
        else:
            identity["cmdline"] = ["/venv/bin/python", "/venv/bin/mlflow", "server"]
    _stale_state(tmp_path / "team", bystander.pid, identity)
    assert team.main(["down", "--dir", str(tmp_path / "team")]) == 0
    assert bystander.poll() is None, "down signalled a process it did not start"
    err = capsys.readouterr().err
    assert f"pid {bystander.pid} is not the mlflow server team-up started" in err
    assert {"none": "predates start-time records", "other_start": "it started at tick",
            "other_cmdline": "its command line is"}[record] in err
    assert not (tmp_path / "team" / "team.json").exists()  # the stale record is gone


def test_down_stops_the_process_it_started_and_its_group(team, tmp_path):
    # What up records for a server: pid, start time and boot; the command line once it answers.
    leader = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    try:
        # Popen returns once exec closed its pipe, before the kernel set the new command line; once
        # sh has forked its sleep, its exec is long done (up reads the command line after an answer).
        wait_for(lambda: len(group_members(leader.pid)) >= 2, 30, "sh to start its sleep")
        identity = team.proc_identity(leader.pid)
        assert identity["cmdline"] == ["sh", "-c", "sleep 300 & wait"]
        _stale_state(tmp_path / "team", leader.pid, identity)
        assert team.main(["down", "--dir", str(tmp_path / "team")]) == 0
        assert leader.wait(timeout=10) is not None
        assert not group_members(leader.pid)  # the child sleep went with it
    finally:
        leader.kill()


def test_stdout_sources_the_credentials_file_instead_of_printing_them(team, tmp_path):
    drawn = team.load_secrets(tmp_path, create=True)
    state = {"dir": str(tmp_path), "mlflow_url": "http://127.0.0.1:5000", "prefect_api_url": "http://127.0.0.1:4200/api"}
    printed = team.exports(state)
    for secret in (drawn["postgres_password"], drawn["mlflow_password"], drawn["prefect_auth_string"]):
        assert secret not in printed
    env_file = tmp_path / team.CLIENT_ENV_FILE
    team.write_private(env_file, team.client_exports(state, drawn))
    assert env_file.stat().st_mode & 0o777 == 0o600
    # What `eval "$(make -s team-up)"` leaves in the user's shell.
    shell = subprocess.run(["bash", "-c", 'eval "$1" && env', "_", printed], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}, check=True)
    env = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000" and env["PREFECT_API_URL"].endswith("/api")
    assert env["MLFLOW_TRACKING_USERNAME"] == "trainflow"
    assert env["MLFLOW_TRACKING_PASSWORD"] == drawn["mlflow_password"]
    assert env["PREFECT_API_AUTH_STRING"] == drawn["prefect_auth_string"]
    assert "PGPASSWORD" not in env  # only the servers need the database password
