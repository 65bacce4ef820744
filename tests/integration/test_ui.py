"""`trainflow ui` on the state a real `trainflow run` left (the session's ``cli_run``): both UIs
serve that run, and a Ctrl-C leaves no process of either server behind."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from core.procs import group_members, pid_alive
from tests.conftest import ROOT, load_script

pytestmark = pytest.mark.integration


def _script():
    return load_script("ui_screenshots")


def _get(url: str, data: dict | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        kids.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return kids


def test_ui_serves_the_runs_state_and_ctrl_c_stops_both_servers(cli_run):
    shots = _script()
    s = cli_run.summary
    env = {**cli_run.env, "PYTHONPATH": str(ROOT)}
    ui = shots.UI(env)  # `trainflow ui --prefect-port 0 --mlflow-port 0`, until both answer
    try:
        prefect, mlflow = ui.urls["Prefect"], ui.urls["MLflow"]
        assert prefect.startswith("http://127.0.0.1:") and mlflow.startswith("http://127.0.0.1:")
        # Each server is a child of `trainflow ui`, leading a process group of its own.
        groups = _children(ui.proc.pid)
        assert len(groups) == 2 and all(os.getpgid(pid) == pid for pid in groups)
        members = [p for g in groups for p in group_members(g)]
        assert len(members) >= 3  # prefect; mlflow and its uvicorn

        # Prefect: the run's flow run, from the history the temporary server recorded.
        _, body = _get(f"{prefect}/api/flow_runs/filter", {"flow_runs": {"id": {"any_": [s["prefect_flow_run_id"]]}}})
        runs = json.loads(body)
        assert [(r["id"], r["state_type"]) for r in runs] == [(s["prefect_flow_run_id"], "COMPLETED")]
        # The summary's link is a page the UI serves (the SPA answers a browser's navigation).
        status, page = _get(f"{prefect}/runs/flow-run/{s['prefect_flow_run_id']}", headers={"Accept": "text/html"})
        assert status == 200 and b"<html" in page.lower()
        # MLflow: the registered model and version of that run, from mlflow.db.
        _, body = _get(f"{mlflow}/api/2.0/mlflow/registered-models/get?name={s['model_name']}")
        versions = json.loads(body)["registered_model"]["latest_versions"]
        assert (s["model_version"], s["mlflow_run_id"]) in [(v["version"], v["run_id"]) for v in versions]
        # No browser here (5-10 s): scripts/ui_screenshots.py renders both pages in Chromium and checks them.
    finally:
        code = ui.stop()  # SIGINT, as a Ctrl-C
    assert code == 0, "".join(ui.output)[-2000:]
    assert "stopped" in "".join(ui.output)
    assert [g for g in groups if group_members(g)] == [], "a server's process group outlived `trainflow ui`"
    assert [p for p in members if pid_alive(p)] == []
