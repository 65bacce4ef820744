"""The Prefect API a ``trainflow run`` talks to, started before Prefect is imported: all of the
CLI's start-up that is not the flow itself.

With ``PREFECT_API_URL`` set, that server is used as it is. Without it, Prefect 3's
ephemeral mode would start a temporary API server (uvicorn in a subprocess) when the
flow starts, i.e. after the CLI has paid for every import, and wait for it.
``TemporaryServer`` starts the same server (Prefect's app in ephemeral mode, served by
uvicorn as Prefect's ``SubprocessASGIServer`` does) *first*, so its boot runs on another
core while this process imports Prefect, MLflow and the later stages (``import_while_booting``);
``wait()`` is called just before the flow starts. ``TRAINFLOW_PREFECT_API=ephemeral`` turns
this off (Prefect's own mode).

It is stopped at exit after Prefect's own exit handlers have flushed logs and events
(registered before Prefect is imported; atexit runs last-in first-out), and it dies with
this process (``PR_SET_PDEATHSIG``) if this process is killed. It runs in a session of its
own, so a closed terminal's SIGHUP or a Ctrl-C reaches only this process, which stops the
job and then the server, in that order.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from core.procs import parent_death_signal

OPT_OUT = "TRAINFLOW_PREFECT_API"
# Set by ``start_api`` to the temporary server's URL, so the run can tell it from a persistent
# server (flows.promotion takes a Prefect concurrency limit only on the latter).
TEMPORARY_API = "TRAINFLOW_TEMPORARY_PREFECT_API"

# The environment of the temporary server (public Prefect settings only): no UI, and two
# start-up costs a server that lives for one run does not need: registering the installed
# block types (it imports every Prefect collection, prefect-kubernetes and prefect-docker
# here, only to hash them; a real `prefect server start` on the same database registers
# them), and the automation services (reactive
# triggers and their actions; no automation can be defined against a server that exists
# only while one run does). Task-run recording, event persistence and logs stay on.
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
}


# What the later stages import, imported while the server boots: paid anyway during the run, they
# cost no wall time then. Not GX: validation is cached on the data and suite, so a warm run never
# needs it, and a cold one imports it in the task. Not torch: a classifier's program is scored by
# the training worker that made it, so this process needs torch only for a language model or when
# the worker's scores are missing.
LATER_STAGE_IMPORTS = ("mlflow.store.tracking.sqlalchemy_store", "evaluation.evaluate", "evaluation.gates",
                       "registry.models", "mlflow.pyfunc")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_app():
    """uvicorn's factory for the temporary server (runs in the server's process).

    Prefect's app in ephemeral mode (no UI; only the services Prefect marks for ephemeral
    servers, e.g. task-run recording and event persistence) and ``final`` (its last app in this
    process: frees the routers' copies). Given as ``create_app``'s public arguments: Prefect's
    own ``SubprocessASGIServer`` passes them through the private ``PREFECT__SERVER_EPHEMERAL`` /
    ``PREFECT__SERVER_FINAL`` variables, for which no public setting exists.
    """
    from prefect.server.api.server import create_app as prefect_app

    return prefect_app(ephemeral=True, final=True)


class TemporaryServer:
    """A private Prefect API server on 127.0.0.1 for this process's lifetime."""

    def __init__(self, log_path: Path):
        self.port = _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0

    def _cmd(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).resolve().parent.parent),
                "--factory", "flows.api_server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                "--log-level", "error", "--lifespan", "on"]

    def start(self) -> "TemporaryServer":
        env = {**os.environ, **SERVER_ENV}
        env.pop("PREFECT_API_URL", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._cmd(), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, preexec_fn=parent_death_signal(signal.SIGTERM))
        self.started_at = time.perf_counter()
        atexit.register(self.stop)
        return self

    def ready(self) -> bool:
        """Whether ``/api/health`` answers now (no waiting)."""
        try:
            with urllib.request.urlopen(self.api_url + "/health", timeout=0.5) as r:
                return r.status == 200
        except OSError:
            return False

    def import_while_booting(self) -> None:
        """Import the later stages' modules (``LATER_STAGE_IMPORTS``) until the server answers."""
        import importlib

        for name in LATER_STAGE_IMPORTS:
            if self.ready():
                return
            importlib.import_module(name)

    def wait(self, timeout_s: float = 90.0) -> float:
        """Block until ``/api/health`` answers; returns the seconds spent waiting here."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise RuntimeError(f"the temporary Prefect API server exited ({code}); see {self.log_path}")
            try:
                with urllib.request.urlopen(self.api_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the temporary Prefect API server did not answer within {timeout_s:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_api(prefect_home: Path) -> TemporaryServer | None:
    """Start a temporary API server and point ``PREFECT_API_URL`` at it, unless one is set.

    Call before anything imports Prefect (its settings are read from the environment).
    Returns None when an existing server (``PREFECT_API_URL``) or Prefect's own ephemeral
    mode (``TRAINFLOW_PREFECT_API=ephemeral``) is to be used.
    """
    if os.environ.get("PREFECT_API_URL") or os.environ.get(OPT_OUT, "").lower() == "ephemeral":
        return None
    if "prefect" in sys.modules:  # too late: Prefect has read its settings already
        return None
    server = TemporaryServer(prefect_home / "temporary-server.log").start()
    os.environ["PREFECT_API_URL"] = os.environ[TEMPORARY_API] = server.api_url
    # Prefect logs "View at <UI URL>/runs/flow-run/<id>" with a UI URL inferred from the API URL:
    # a dead link once this server stops. Empty: no such line; the summary says to open `trainflow ui`.
    os.environ.setdefault("PREFECT_UI_URL", "")
    return server


def persistent_api_url() -> str | None:
    """The Prefect API this process talks to when it is a persistent server, else None (Prefect's
    ephemeral mode, or the temporary server ``start_api`` started). Call after Prefect's import."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url or url.rstrip("/") == os.environ.get(TEMPORARY_API, "").rstrip("/"):
        return None
    return url


@contextmanager
def heartbeats_where_watched() -> Iterator[None]:
    """Prefect's flow-run heartbeats let a server that outlives the run mark it crashed when its
    process dies (a zombie-detection automation). A temporary or ephemeral server stops with the
    run, so nothing can watch them there: they are turned off for the flow, which also spares
    the flow's end its wait for the heartbeat thread's next one-second wake-up. Against a server
    that outlives the run, Prefect's own setting (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``) holds."""
    if persistent_api_url():
        yield
        return
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
