"""The temporary Prefect API server ``trainflow run`` starts before importing Prefect."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request

import pytest

from flows.api_server import TemporaryServer, start_api
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    wait_for(lambda: not _alive(pid), timeout_s, f"process {pid} to exit")
    return True


def _processes_with(needle: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if needle.encode() in fh.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _server_env(tmp_path) -> dict:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "TRAINFLOW_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def test_start_api_leaves_a_named_server_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    assert start_api(tmp_path) is None
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("TRAINFLOW_PREFECT_API", "ephemeral")
    assert start_api(tmp_path) is None
    assert "PREFECT_API_URL" not in os.environ


@pytest.mark.fault
def test_server_dies_with_a_killed_parent(tmp_path):
    """kill -9 of the CLI must not leave its API server behind."""
    code = ("import sys,time; from pathlib import Path; from flows.api_server import TemporaryServer;"
            "s=TemporaryServer(Path(sys.argv[1])).start(); print(s.proc.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "server.log")], env=_server_env(tmp_path),
                              stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(parent.stdout.readline())
        assert _alive(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_gone(server_pid, 15), "the API server outlived its killed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_cli_run_starts_its_own_server_and_stops_it(cli_run):
    """`trainflow run` with no PREFECT_API_URL: the default path of `make run`."""
    assert cli_run.summary["status"] == "registered"
    log = cli_run.root / "prefect" / "temporary-server.log"
    assert log.exists()  # the server was ours, not Prefect's own ephemeral one
    # It promoted under the registry lease alone: no Prefect concurrency limit on a server that
    # lives for one run (flows/promotion.py). Its database stays in PREFECT_HOME.
    with sqlite3.connect(cli_run.root / "prefect" / "prefect.db") as db:
        assert db.execute("select name from concurrency_limit_v2").fetchall() == []
    assert cli_run.summary["promotion"]["promoted"] is True
    # Stopped at exit: no uvicorn serving Prefect's app is left running from this PREFECT_HOME.
    leftovers = [p for p in _processes_with("flows.api_server:create_app")
                 if str(cli_run.root) in open(f"/proc/{p}/environ", "rb").read().decode(errors="replace")]
    assert leftovers == []
    # No "View at <temporary server>/runs/flow-run/..." in its log: that server is gone now. The
    # summary says where the run is instead: through `trainflow ui`, and the files on disk.
    output = cli_run.proc.stdout + cli_run.proc.stderr
    assert "View at" not in output
    s = cli_run.summary
    assert s["ui"] == {"prefect": None, "mlflow": None}
    assert "run `trainflow ui`" in cli_run.proc.stderr
    assert f"/runs/flow-run/{s['prefect_flow_run_id']}" in cli_run.proc.stderr
    assert f"/#/models/{s['model_name']}/versions/{s['model_version']}" in cli_run.proc.stderr
    for path in (s["plots"]["training_curves"], s["plots"]["confusion_matrix"], s["validation"]["data_docs"]):
        assert path in cli_run.proc.stderr and os.path.isfile(path), path


def test_four_servers_started_together_on_a_new_home_all_answer(monkeypatch, tmp_path):
    """Four first runs at once on an empty PREFECT_HOME: each creates and migrates the one
    ``prefect.db``; under the home's lock they take turns, and every server comes up, answers
    /health, runs Prefect's app through our factory's public arguments, and stops."""
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    servers = [TemporaryServer(tmp_path / f"server-{i}.log").start() for i in range(4)]
    try:
        failed = []
        for server in servers:
            try:
                server.wait(timeout_s=240)
            except RuntimeError as exc:
                failed.append(f"{exc}: {server.log_path.read_text()[-400:]}")
        assert failed == []
        for server in servers:
            with urllib.request.urlopen(server.api_url + "/health", timeout=5) as r:
                assert r.status == 200
        pid = servers[0].proc.pid
        # Prefect's app in ephemeral mode through our factory's public arguments, not Prefect's
        # private PREFECT__SERVER_* switches.
        assert b"flows.api_server:create_app" in open(f"/proc/{pid}/cmdline", "rb").read()
        environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        assert [v for v in environ if v.startswith(b"PREFECT__")] == []
    finally:
        for server in servers:
            server.stop()
    assert all(_wait_gone(server.proc.pid, 10) for server in servers)
