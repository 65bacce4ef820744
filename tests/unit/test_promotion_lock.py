"""Which layers a promotion holds: the Prefect global concurrency limit only on a persistent Prefect
server, always the registry lease under it (tests/integration/test_promotion_prefect.py: the real ones)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

import flows.promotion as promotion
from flows.api_server import TEMPORARY_API


@pytest.fixture
def entered(monkeypatch):
    """The layers ``promotion_lock`` enters and leaves, in order (each replaced by a recorder)."""
    events: list[str] = []

    @contextmanager
    def layer(name):
        events.append(f"enter {name}")
        yield
        events.append(f"exit {name}")

    monkeypatch.setattr(promotion, "prefect_limit", lambda model: layer(promotion.limit_name(model)))
    monkeypatch.setattr("registry.lease.hold", lambda model, **kw: layer(f"lease {model}"))
    monkeypatch.delenv(TEMPORARY_API, raising=False)
    return events


def _promote(tmp_path, events):
    with promotion.promotion_lock("sqlite:///x.db", tmp_path, "digits-classifier"):
        events.append("promote")
    return events


@pytest.mark.parametrize("api, temporary", [(None, None),  # Prefect's own ephemeral mode
                                            ("http://127.0.0.1:41234/api", "http://127.0.0.1:41234/api")])
def test_ephemeral_or_temporary_server_promotes_under_the_lease_alone(entered, tmp_path, monkeypatch, api, temporary):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if temporary:
        monkeypatch.setenv(TEMPORARY_API, temporary)
    with temporary_settings(updates={PREFECT_API_URL: api} if api else None,
                            restore_defaults=None if api else {PREFECT_API_URL}):
        assert promotion.persistent_api_url() is None
        assert _promote(tmp_path, entered) == ["enter lease digits-classifier", "promote",
                                               "exit lease digits-classifier"]


def test_a_persistent_server_adds_the_prefect_limit_around_the_lease(entered, tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv(TEMPORARY_API, "http://127.0.0.1:41234/api")  # an earlier run's, not this server
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.internal:4200/api"}):
        assert promotion.persistent_api_url() == "http://prefect.internal:4200/api"
        assert _promote(tmp_path, entered) == [
            "enter promote-digits-classifier", "enter lease digits-classifier", "promote",
            "exit lease digits-classifier", "exit promote-digits-classifier"]
