"""The Prefect API a ``trainflow run`` talks to, started before Prefect is imported.

With ``PREFECT_API_URL`` set, that server is used as it is. Otherwise Prefect 3's ephemeral mode would
start its temporary server when the flow starts, after every import, and wait for it; ``TemporaryServer``
starts the same server first, so it boots on another core while this process imports Prefect and
MLflow. ``TRAINFLOW_PREFECT_API=ephemeral`` turns this off.

It is stopped at exit after Prefect's own exit handlers flushed logs and events (atexit runs last-in
first-out), dies with this process (``PR_SET_PDEATHSIG``), and runs in a session of its own, so a
SIGHUP or Ctrl-C reaches only this process, which stops the job and then the server.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from flows.ui import HOST, Server, _bind

OPT_OUT = "TRAINFLOW_PREFECT_API"
# Set by ``start_api`` to the temporary server's URL, so the run can tell it from a persistent
# server (flows.promotion takes a Prefect concurrency limit only on the latter).
TEMPORARY_API = "TRAINFLOW_TEMPORARY_PREFECT_API"

# The temporary server's environment (public Prefect settings only): no UI, no block type registration
# (it imports every Prefect collection only to hash them; a real `prefect server start` on the same
# database registers them) and no automation services (no automation can be defined against a server
# that lives for one run). Task-run recording, event persistence and logs stay on.
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
    "PREFECT_SERVER_DATABASE_MIGRATE_ON_START": "false",  # create_app migrates, under the home's lock
}


# The lock file, in PREFECT_HOME, under which a temporary server creates and migrates the database.
DATABASE_LOCK = "database.lock"


async def migrate_database() -> None:
    """Create and migrate Prefect's database under the home's lock: servers that start together on a
    new home (concurrent first runs) would otherwise each run the migrations at once and fail on one
    another's half-made tables. On a database already at the head revision this is a check."""
    import asyncio

    from prefect.server.database import provide_database_interface
    from prefect.settings import get_current_settings

    from core.locks import release, wait_lock

    fd = await asyncio.to_thread(wait_lock, Path(get_current_settings().home) / DATABASE_LOCK, 600.0)
    try:
        await provide_database_interface().create_db()
    finally:
        release(fd)


def create_app():
    """uvicorn's factory for the temporary server: Prefect's app as its ``SubprocessASGIServer`` makes it,
    but through ``create_app``'s public arguments instead of private ``PREFECT__SERVER_*`` variables.
    Its start-up first migrates the database under the home's lock (``SERVER_ENV`` turns the app's
    own, unlocked migration off)."""
    from contextlib import asynccontextmanager

    from prefect.server.api.server import create_app as prefect_app

    app = prefect_app(ephemeral=True, final=True)
    prefect_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_):
        await migrate_database()
        async with prefect_lifespan(app_) as state:
            yield state

    app.router.lifespan_context = lifespan
    return app


class TemporaryServer(Server):
    """A private Prefect API server on 127.0.0.1 for this process's lifetime (stopped at exit)."""

    def __init__(self, log_path: Path):
        self.port = _bind(0)
        url = f"http://{HOST}:{self.port}"
        self.api_url, self.log_path = f"{url}/api", log_path
        cmd = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(__file__).resolve().parent.parent),
               "--factory", "flows.api_server:create_app", "--host", HOST, "--port", str(self.port),
               "--log-level", "error", "--lifespan", "on"]
        env = {k: v for k, v in {**os.environ, **SERVER_ENV}.items() if k != "PREFECT_API_URL"}
        super().__init__("temporary Prefect API", url, f"{self.api_url}/health", cmd, env, log_path, grace_s=5.0)

    def start(self) -> "TemporaryServer":
        super().start()
        atexit.register(self.stop)
        return self

    def wait(self, timeout_s: float = 90.0) -> float:
        """Block until ``/api/health`` answers; returns the seconds spent waiting here."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc is None or self.exited() is not None:
                raise RuntimeError(f"the temporary Prefect API server exited ({self.exited()}){self._last_line()}; "
                                   f"see {self.log_path}")
            if self.ready():
                return time.perf_counter() - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"the temporary Prefect API server did not answer within {timeout_s:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    def _last_line(self) -> str:
        """``: <the log's last line>`` (where a server's exception ends up), or "" without one."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(0, log.seek(0, os.SEEK_END) - 2000))
                lines = [line for line in log.read().decode(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()[:300]}" if lines else ""


def start_api(prefect_home: Path) -> TemporaryServer | None:
    """Start a temporary API server and point ``PREFECT_API_URL`` at it; call before Prefect is imported.
    None when ``PREFECT_API_URL`` is set or ``TRAINFLOW_PREFECT_API=ephemeral`` asks for Prefect's own mode."""
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
    """Flow-run heartbeats only where a server outlives the run and can mark it crashed: against a
    temporary or ephemeral server they are off (which also spares the flow's end its wait for the
    heartbeat thread); elsewhere ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` holds."""
    if persistent_api_url():
        yield
        return
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
