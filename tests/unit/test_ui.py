"""`trainflow ui`'s choices (which servers, on which files and ports) and the end-of-run lines that
say where to look: no link to the temporary Prefect server that is gone when the run ends."""

from __future__ import annotations

import os
import re
import socket

import pytest

from flows.cli import _print_summary, main
from flows.ui import UIError, choose_port, servers_for, ui_bases, where_to_look

SUMMARY = {"status": "registered", "mlflow_run_id": "r" * 32, "prefect_flow_run_id": "0b7c-flow-run",
           "model_name": "digits-classifier", "model_version": "3", "aliases": ["champion"],
           "plots": {"training_curves": "/state/runs/x/plots/training_curves.png",
                     "confusion_matrix": "/state/runs/x/evaluation/confusion_matrix.png"},
           "validation": {"success": True, "data_docs": "/state/runs/x/validation/data_docs/index.html"}}


@pytest.fixture
def state(tmp_path):
    """A TRAINFLOW_HOME as `trainflow run` leaves it: the two databases (empty files are enough here)."""
    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "prefect.db").touch()
    (tmp_path / "mlflow.db").touch()
    return tmp_path


def test_summary_after_a_local_run_points_at_trainflow_ui_and_the_files(capsys):
    _print_summary({**SUMMARY, "ui": {"prefect": None, "mlflow": None}})
    err = capsys.readouterr().err
    assert "run `trainflow ui`" in err
    assert "http://127.0.0.1:4200/runs/flow-run/0b7c-flow-run" in err
    assert f"http://127.0.0.1:5000/#/runs/{'r' * 32}" in err
    assert "http://127.0.0.1:5000/#/models/digits-classifier/versions/3" in err
    for path in ("training_curves.png", "confusion_matrix.png", "data_docs/index.html"):
        assert "/state/runs/x/" in err and path in err
    # Every link is on `trainflow ui`'s ports: none on a temporary server's random port.
    assert set(re.findall(r"http://127\.0\.0\.1:(\d+)", err)) == {"4200", "5000"}
    # A URL is printed whole on one line (copied, not re-assembled from a wrapped table cell).
    assert any(line.endswith("/runs/flow-run/0b7c-flow-run") for line in err.splitlines())


def test_summary_links_running_servers_directly():
    prefect, mlflow = ui_bases("http://prefect.team:4200/api", False, "https://mlflow.team")
    assert (prefect, mlflow) == ("http://prefect.team:4200", "https://mlflow.team")
    rows = dict(where_to_look(SUMMARY, prefect, mlflow))
    assert "look at" not in rows
    assert rows["prefect"] == "http://prefect.team:4200/runs/flow-run/0b7c-flow-run"
    assert rows["mlflow model"] == "https://mlflow.team/#/models/digits-classifier/versions/3"
    # The run's own temporary server, or Prefect's ephemeral mode: gone by now, never linked.
    assert ui_bases("http://127.0.0.1:40123/api", True, "sqlite:////state/mlflow.db") == (None, None)
    assert ui_bases(None, False, "sqlite:////state/mlflow.db") == (None, None)
    assert ui_bases("http://h:1/api", False, None, prefect_ui="http://ui.team") == ("http://ui.team", None)
    # A run that stopped before registering: no model row, the rest stays.
    rows = dict(where_to_look({**SUMMARY, "model_version": None}))
    assert "mlflow model" not in rows and "prefect" in rows and "data docs" in rows


def test_ui_serves_the_databases_the_run_wrote_on_localhost(state):
    env = {"PATH": os.environ.get("PATH", ""), "PREFECT_HOME": str(state / "prefect"), "PREFECT_UI_ENABLED": "false",
           "PREFECT_UI_URL": "", "MLFLOW_TRACKING_URI": ""}
    servers, elsewhere = servers_for(state, 0, 0, env)
    prefect, mlflow = servers
    assert elsewhere == []
    assert prefect.env["PREFECT_HOME"] == str(state / "prefect")  # its default database: prefect.db there
    port = prefect.cmd[prefect.cmd.index("--port") + 1]
    assert prefect.env["PREFECT_UI_API_URL"] == f"http://127.0.0.1:{port}/api"  # the UI calls this port's API
    assert "PREFECT_UI_ENABLED" not in prefect.env and "--ui" in prefect.cmd
    assert mlflow.cmd[mlflow.cmd.index("--backend-store-uri") + 1] == f"sqlite:///{state / 'mlflow.db'}"
    assert mlflow.cmd[mlflow.cmd.index("--default-artifact-root") + 1] == str(state / "mlartifacts")
    for server in servers:
        assert server.cmd[server.cmd.index("--host") + 1] == "127.0.0.1"
        assert server.log.parent == state / "ui"


def test_ui_shows_running_servers_instead_of_starting_them(state):
    env = {"PREFECT_API_URL": "http://prefect.team:4200/api", "MLFLOW_TRACKING_URI": "https://mlflow.team"}
    servers, elsewhere = servers_for(state, None, None, env)
    assert servers == []
    assert any("http://prefect.team:4200" in line for line in elsewhere)
    assert any("https://mlflow.team" in line for line in elsewhere)


def test_ui_before_any_run_is_one_line_naming_the_missing_database(tmp_path, monkeypatch, capsys):
    with pytest.raises(UIError, match=r"prefect\.db: no Prefect run history here yet"):
        servers_for(tmp_path, env={"PREFECT_HOME": str(tmp_path / "prefect")})
    (tmp_path / "prefect").mkdir()
    (tmp_path / "prefect" / "prefect.db").touch()
    with pytest.raises(UIError, match=r"mlflow\.db: no MLflow database here yet"):
        servers_for(tmp_path, 0, 0, env={"PREFECT_HOME": str(tmp_path / "prefect")})
    saved = dict(os.environ)
    try:
        monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "empty"))
        for key in ("PREFECT_HOME", "PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_DATABASE_CONNECTION_URL"):
            monkeypatch.delenv(key, raising=False)
        assert main(["ui"]) == 1
    finally:
        os.environ.clear()
        os.environ.update(saved)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainflow: error: ui: ") and "prefect.db" in err[0]


def test_ui_ports_default_to_fixed_ones_and_never_take_a_busy_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(UIError, match=f"--mlflow-port {taken}: the port is in use"):
            choose_port(taken, 5000, "--mlflow-port")
        other = choose_port(None, taken, "--prefect-port")  # the default is busy: any free port
        assert other != taken and other > 0
        assert choose_port(0, taken, "--prefect-port") != taken
