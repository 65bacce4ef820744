"""``trainflow ui``: the Prefect UI and the MLflow UI on the local state, and where a run's pages are.

Both servers run on the files ``trainflow run`` recorded into (``PREFECT_HOME``, by default
``TRAINFLOW_HOME/prefect/prefect.db``; ``TRAINFLOW_HOME/mlflow.db``), bound to 127.0.0.1, each in a
session of its own (a Ctrl-C reaches only this process, which then stops each server's process group)
and with ``PR_SET_PDEATHSIG`` (a SIGKILL of this process takes them down too).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from core.errors import TrainflowError
from core.paths import default_tracking_uri, under_home
from core.procs import group_members, parent_death_signal, stop_group

HOST = "127.0.0.1"
PREFECT_PORT, MLFLOW_PORT = 4200, 5000
# Where `trainflow ui` serves the local state when its default ports are free.
LOCAL_PREFECT_UI, LOCAL_MLFLOW_UI = f"http://{HOST}:{PREFECT_PORT}", f"http://{HOST}:{MLFLOW_PORT}"
BIN = Path(sys.executable).parent


class UIError(TrainflowError):
    """A server could not be started or stopped answering (one line: which, why, its log)."""


def _bind(port: int) -> int | None:
    """The port bound on ``HOST`` (0: a free one the system picks), None when it is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return None
        return s.getsockname()[1]


def choose_port(asked: int | None, default: int, option: str) -> int:
    """``asked`` if free (0: any free port); no ask: ``default`` if free, else any free port."""
    if asked:
        if _bind(asked) is None:
            raise UIError(f"{option} {asked}: the port is in use (0 picks a free one)")
        return asked
    return (asked is None and _bind(default)) or _bind(0)


@dataclass
class Server:
    """One UI server: a command in its own process group, logging to a file."""

    name: str
    url: str  # what a browser opens
    health: str  # answers 200 once the server is up
    cmd: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    grace_s: float = 15.0  # SIGTERM to SIGKILL

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=parent_death_signal(signal.SIGTERM))

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.health, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL what is left of it after a grace period; reap the leader.
        Once the leader is reaped its group id may be another's: a second call does nothing."""
        if self.proc is not None and self.proc.returncode is None:
            stop_group(self.proc.pid, grace=self.grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


def prefect_server(port: int, env: dict[str, str], log: Path) -> Server:
    """``prefect server start`` on the database ``trainflow run``'s temporary server used: the same
    ``PREFECT_HOME`` (and ``PREFECT_API_DATABASE_CONNECTION_URL`` when set), with the UI on."""
    url = f"http://{HOST}:{port}"
    env = {k: v for k, v in env.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL", "PREFECT_UI_ENABLED")}
    # The UI calls the API on PREFECT_SERVER_API_PORT (4200) unless PREFECT_UI_API_URL says otherwise.
    env.update(PREFECT_SERVER_API_HOST=HOST, PREFECT_SERVER_API_PORT=str(port), PREFECT_UI_API_URL=f"{url}/api",
               PREFECT_SERVER_UI_ENABLED="true", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    # No services (scheduler, late runs, event persister...): this server only shows what is recorded.
    cmd = [str(BIN / "prefect"), "server", "start", "--host", HOST, "--port", str(port), "--no-services", "--ui"]
    return Server("Prefect", url, f"{url}/api/health", cmd, env, log)


def mlflow_server(port: int, backend_uri: str, artifact_root: Path, env: dict[str, str], log: Path) -> Server:
    """``mlflow server`` on the tracking database, one worker, artifacts read where the runs wrote them."""
    url = f"http://{HOST}:{port}"
    env = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # its job runner serves GenAI scorers: not needed
    cmd = [str(BIN / "mlflow"), "server", "--backend-store-uri", backend_uri,
           "--default-artifact-root", str(artifact_root), "--no-serve-artifacts",
           "--host", HOST, "--port", str(port), "--workers", "1"]
    return Server("MLflow", url, f"{url}/health", cmd, env, log)


def servers_for(home: Path, prefect_port: int | None = None, mlflow_port: int | None = None,
                env: dict[str, str] | None = None) -> tuple[list[Server], list[str]]:
    """The servers to start for ``home`` and the lines about what is served elsewhere already
    (``PREFECT_API_URL`` / an http(s) ``MLFLOW_TRACKING_URI``: a running server, shown as it is)."""
    env = dict(os.environ if env is None else env)
    servers, elsewhere = [], []
    if env.get("PREFECT_API_URL"):
        ui = env.get("PREFECT_UI_URL") or env["PREFECT_API_URL"].removesuffix("/").removesuffix("/api")
        elsewhere.append(f"Prefect UI: {ui}  (PREFECT_API_URL names a running server: not started here)")
    else:
        prefect_home = Path(env.get("PREFECT_HOME") or home / "prefect")
        if not env.get("PREFECT_API_DATABASE_CONNECTION_URL") and not (prefect_home / "prefect.db").is_file():
            raise UIError(f"{prefect_home / 'prefect.db'}: no Prefect run history here yet (run `trainflow run` first)")
        port = choose_port(prefect_port, PREFECT_PORT, "--prefect-port")
        servers.append(prefect_server(port, env, under_home(home, "ui", "prefect-server.log")))
    uri = env.get("MLFLOW_TRACKING_URI") or default_tracking_uri(home)
    if uri.startswith(("http://", "https://")):
        elsewhere.append(f"MLflow UI:  {uri}  (MLFLOW_TRACKING_URI names a running server: not started here)")
    else:
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            raise UIError(f"{uri.removeprefix('sqlite:///')}: no MLflow database here yet (run `trainflow run` first)")
        port = choose_port(mlflow_port, MLFLOW_PORT, "--mlflow-port")
        servers.append(mlflow_server(port, uri, under_home(home, "mlartifacts"), env,
                                     under_home(home, "ui", "mlflow-server.log")))
    return servers, elsewhere


def serve(servers: list[Server], elsewhere: list[str], out: Callable[[str], None] = print,
          timeout_s: float = 180.0, stop: threading.Event | None = None) -> int:
    """Start ``servers``, print their URLs once they answer, wait for Ctrl-C / SIGTERM / SIGHUP (or
    ``stop``), then stop each server's process group. Returns 0, or raises UIError when a server
    does not come up or exits meanwhile (the others are stopped first)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda *_: stop.set())
    try:
        for server in servers:
            server.start()
        deadline = time.monotonic() + timeout_s
        waiting = list(servers)
        while waiting and not stop.is_set():
            for server in list(waiting):
                if server.exited() is not None:
                    raise UIError(f"the {server.name} server exited ({server.exited()}) during start-up; see {server.log}")
                if server.ready():
                    waiting.remove(server)
            if waiting and time.monotonic() > deadline:
                names = ", ".join(s.name for s in waiting)
                raise UIError(f"{names} did not answer within {timeout_s:.0f} s; see {waiting[0].log}")
            stop.wait(0.3)
        if stop.is_set():
            return 0
        for server in servers:
            out(f"{server.name} UI: {server.url}".ljust(36) + f"  (log: {server.log})")
        for line in elsewhere:
            out(line)
        out("Ctrl-C stops " + ("them" if len(servers) > 1 else "it") if servers else "nothing to serve here")
        while servers and not stop.wait(0.5):
            for server in servers:
                if server.exited() is not None:
                    raise UIError(f"the {server.name} server exited ({server.exited()}); see {server.log}")
        return 0
    finally:  # side by side: each server's shutdown waits on its open connections
        stoppers = [threading.Thread(target=server.stop) for server in servers]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join()
        if servers:
            left = [p for s in servers if s.proc is not None for p in group_members(s.proc.pid)]
            out("stopped" if not left else f"could not stop pids {left}")


def ui_bases(prefect_api: str | None, temporary: bool, tracking: str | None,
             prefect_ui: str | None = None) -> tuple[str | None, str | None]:
    """``(Prefect UI, MLflow UI)`` that show a finished run now, None where only ``trainflow ui``
    can (the run's temporary API server is gone, or MLflow is a local database)."""
    prefect = None
    if prefect_api and not temporary:
        prefect = prefect_ui or prefect_api.removesuffix("/").removesuffix("/api")
    mlflow = tracking.rstrip("/") if tracking and tracking.startswith(("http://", "https://")) else None
    return prefect, mlflow


def where_to_look(summary: dict, prefect_ui: str | None = None, mlflow_ui: str | None = None) -> list[tuple[str, str]]:
    """Rows for the end-of-run summary: the run's pages in both UIs (through ``trainflow ui`` where
    a base is None), then the files on disk (plots, Data Docs). No link to a server that is gone."""
    rows = []
    prefect, mlflow = prefect_ui or LOCAL_PREFECT_UI, mlflow_ui or LOCAL_MLFLOW_UI
    if prefect_ui is None or mlflow_ui is None:
        rows.append(("look at", "run `trainflow ui` (the UIs on the local state; other ports if these are taken):"))
    if summary.get("prefect_flow_run_id"):
        rows.append(("prefect", f"{prefect}/runs/flow-run/{summary['prefect_flow_run_id']}"))
    if summary.get("mlflow_run_id"):
        rows.append(("mlflow run", f"{mlflow}/#/runs/{summary['mlflow_run_id']}"))
    if summary.get("model_version"):
        rows.append(("mlflow model", f"{mlflow}/#/models/{summary['model_name']}/versions/{summary['model_version']}"))
    plots = summary.get("plots") or {}
    for key, label in (("training_curves", "curves"), ("confusion_matrix", "confusion")):
        if plots.get(key):
            rows.append((label, str(plots[key])))
    validation = summary.get("validation") or {}
    if validation.get("report") and not validation.get("success", True):
        rows.append(("report", str(validation["report"])))
    if validation.get("data_docs"):
        rows.append(("data docs", str(validation["data_docs"])))
    return rows
