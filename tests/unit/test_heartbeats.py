"""Prefect's flow-run heartbeats in ``trainflow run``: off where the server stops with the run
(nothing can watch them), Prefect's own setting where the server outlives it. Read through the
flow engine's own property, the one ``prefect.flow_engine`` consults before starting the thread."""

from __future__ import annotations

import pytest

from flows.api_server import TEMPORARY_API, heartbeats_where_watched


def _engine_heartbeat() -> int | None:
    from prefect import flow
    from prefect.flow_engine import FlowRunEngine

    return FlowRunEngine(flow=flow(lambda: None)).heartbeat_seconds


@pytest.mark.parametrize("api, temporary", [(None, None),  # Prefect's own ephemeral mode
                                            ("http://127.0.0.1:41234/api", "http://127.0.0.1:41234/api")])
def test_a_server_that_stops_with_the_run_gets_no_heartbeats(monkeypatch, api, temporary):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv(TEMPORARY_API, raising=False)
    if temporary:
        monkeypatch.setenv(TEMPORARY_API, temporary)
    with temporary_settings(updates={PREFECT_API_URL: api} if api else None,
                            restore_defaults=None if api else {PREFECT_API_URL}):
        assert _engine_heartbeat() is not None  # Prefect's default: on
        with heartbeats_where_watched():
            assert _engine_heartbeat() is None
        assert _engine_heartbeat() is not None


def test_a_server_that_outlives_the_run_keeps_prefect_s_heartbeat_setting(monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    monkeypatch.setenv(TEMPORARY_API, "http://127.0.0.1:41234/api")  # an earlier run's, not this server
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.internal:4200/api",
                                     PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 45}):
        with heartbeats_where_watched():
            assert _engine_heartbeat() == 45
