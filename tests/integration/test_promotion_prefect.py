"""Promotion on a Prefect server: the real global concurrency limit ``promote-<model>`` on the session's
Prefect test server. Two promoters at once hold it one after the other, and the limit the Prefect UI
shows has the slot. (Which layers a promotion takes, and in which order: tests/unit/test_promotion_lock.py;
the registry lease under it: tests/integration/test_concurrency.py and test_promotion_hosts.py.)"""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.integration


def test_two_promoters_on_a_prefect_server_take_its_concurrency_limit_one_at_a_time(prefect_api):
    from prefect.client.orchestration import get_client

    from flows.promotion import limit_name, persistent_api_url, prefect_limit

    model = "race-prefect"
    assert persistent_api_url()  # the session's server is one no temporary-server mark points at
    held: list[tuple[str, float, float]] = []
    inside = threading.Event()

    def promoter(name: str, hold_s: float) -> None:
        with prefect_limit(model, timeout_s=60):
            t0 = time.monotonic()
            inside.set()
            time.sleep(hold_s)
            held.append((name, t0, time.monotonic()))

    first = threading.Thread(target=promoter, args=("first", 1.5))
    first.start()
    assert inside.wait(60)
    second = threading.Thread(target=promoter, args=("second", 0.1))
    second.start()
    with get_client(sync_client=True) as client:
        during = client.read_global_concurrency_limit_by_name(limit_name(model))
    first.join(60)
    second.join(60)
    with get_client(sync_client=True) as client:
        after = client.read_global_concurrency_limit_by_name(limit_name(model))

    assert [h[0] for h in held] == ["first", "second"]
    assert held[1][1] >= held[0][2]  # the second got in only after the first left
    assert during.limit == 1 and during.active_slots == 1  # created with limit 1; the first's slot
    assert after.active_slots == 0
