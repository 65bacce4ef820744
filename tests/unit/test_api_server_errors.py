"""What a temporary API server that died says: the log's last line, not only its exit code."""

from __future__ import annotations

import pytest

from flows.api_server import SERVER_ENV, TemporaryServer


def test_a_dead_server_is_reported_with_the_last_line_of_its_log(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("Traceback (most recent call last):\n  ...\nsqlite3.OperationalError: database is locked\n\n")
    server = TemporaryServer(log)  # never started: no process to wait for
    with pytest.raises(RuntimeError, match=r"exited \(None\): sqlite3.OperationalError: database is locked; see "):
        server.wait(timeout_s=1)


def test_the_app_does_not_migrate_unlocked():
    """create_app migrates under the home's lock; Prefect's own migration at start-up stays off."""
    assert SERVER_ENV["PREFECT_SERVER_DATABASE_MIGRATE_ON_START"] == "false"
