"""A lease on one model's promotion, kept in the MLflow registry, so every promoter that uses the same
tracking server or database waits for the same one, whichever host or ``TRAINFLOW_HOME`` it has.

MLflow has no lock and no compare-and-set on aliases, but a registered model's version numbers are an
atomic, ordered counter (each created in one transaction, never reused). A promoter takes a *ticket*, a
new version of ``<model>.promotion-lock``, holds the lease once no live ticket with a lower number is
left, and deletes its ticket when done: first come, first served.

A ticket is live while its expiry (renewed every ``lease_s / 4`` by a heartbeat thread) has not passed
and, on the host that took it, while its process exists. A waiter deletes a dead ticket ahead of it, so a
promoter killed on this host frees the lease at once, one killed elsewhere after ``lease_s``. Hosts'
clocks must agree to well within ``lease_s``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.locks import LockTimeoutError
from core.procs import pid_alive
from registry.store import client, ensure_registered_model, is_not_found

log = logging.getLogger(__name__)

SUFFIX = ".promotion-lock"
# A ticket's source: not a model (nothing loads it), in a scheme an MLflow server's source checks accept.
TICKET_SOURCE = "trainflow-lease:/promotion"


def lock_name(model_name: str) -> str:
    """The registered model whose versions are the tickets of ``model_name``'s promotion lease."""
    return f"{model_name}{SUFFIX}"


def host_id() -> str:
    """This host and PID namespace (hostname, boot id, pid namespace): a pid means the same process only
    where this is equal. Containers on one kernel differ in their pid namespace."""
    parts = [socket.gethostname()]
    try:
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
        parts.append(os.readlink("/proc/self/ns/pid"))
    except OSError:
        pass
    return "/".join(parts)


def dead_reason(tags: dict, here: str, now: float) -> str | None:
    """Why a ticket with ``tags`` no longer counts (expired, or its holder on this host is gone), else None."""
    try:
        expires = float(tags.get("expires", "0"))
    except ValueError:
        expires = 0.0
    if expires < now:
        return f"its lease expired {now - expires:.0f} s ago"
    if tags.get("host_id") == here:
        try:
            pid = int(tags.get("pid", ""))
        except ValueError:
            return None
        if not pid_alive(pid):
            return f"its process (pid {pid} on this host) is gone"
    return None


def _holder(tags: dict) -> str:
    return f"{tags.get('holder', '?')}" + (f" ({tags['note']})" if tags.get("note") else "")


@contextmanager
def hold(model_name: str, *, lease_s: float = 60.0, timeout_s: float = 300.0, poll_s: float = 0.25,
         note: str = "", tracking_uri: str | None = None) -> Iterator[None]:
    """Hold the promotion lease of ``model_name`` for the block: LockTimeoutError naming the holder after
    ``timeout_s``. ``note`` is shown to whoever waits; ``tracking_uri`` defaults to ``configure``'s."""
    from mlflow import MlflowClient

    c = MlflowClient(tracking_uri, tracking_uri) if tracking_uri else client()
    name, here = lock_name(model_name), host_id()
    tags = {"holder": f"{socket.gethostname()} pid {os.getpid()}", "host_id": here, "pid": str(os.getpid()),
            "note": note}
    ensure_registered_model(c, name, tags={"trainflow.lock": "promotion"},
                            description=f"Promotion lease of {model_name} (trainflow): each version is "
                                        "a promoter waiting or holding it; they point at no model.")
    ticket = [_take(c, name, tags, lease_s)]  # a list: the heartbeat reads a ticket taken again
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(c, name, ticket, lease_s, stop),
                            name="trainflow-promotion-lease", daemon=True)
    beat.start()
    try:
        _wait_turn(c, name, ticket, tags, here, lease_s, timeout_s, poll_s, model_name)
        yield
    finally:
        stop.set()
        beat.join()
        try:
            c.delete_model_version(name, str(ticket[0]))
        except Exception as exc:
            if not is_not_found(exc):
                log.warning("could not return promotion ticket %s of %s (it lapses in %.0f s): %s",
                            ticket[0], name, lease_s, exc)


def _take(c, name: str, tags: dict, lease_s: float) -> int:
    """A new ticket's number. READY when created: no waiting (nor MLflow's "Waiting up to 300 seconds")."""
    return int(c.create_model_version(name, TICKET_SOURCE, tags={**tags, "expires": f"{time.time() + lease_s:.3f}"},
                                      await_creation_for=0).version)


def _heartbeat(c, name: str, ticket: list[int], lease_s: float, stop: threading.Event) -> None:
    while not stop.wait(lease_s / 4):
        try:
            c.set_model_version_tag(name, str(ticket[0]), "expires", f"{time.time() + lease_s:.3f}")
        except Exception as exc:  # the next beat tries again; the lease lapses only after lease_s
            log.warning("renewing promotion ticket %s of %s: %s", ticket[0], name, exc)


def _wait_turn(c, name: str, ticket: list[int], tags: dict, here: str, lease_s: float, timeout_s: float,
               poll_s: float, model_name: str) -> None:
    """Poll until no live ticket is ahead of ``ticket[0]``. Should another waiter have removed it as dead
    (a clock far off or a heartbeat stalled for ``lease_s``), a new one is taken."""
    deadline = time.monotonic() + timeout_s
    while True:
        mine, now = ticket[0], time.time()
        ahead, present = [], False
        for mv in sorted(c.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version)):
            if int(mv.version) >= mine:
                present = present or int(mv.version) == mine
                continue
            why = dead_reason(mv.tags, here, now)
            if why is None:
                ahead.append(mv)
                continue
            log.warning("promotion lock of %s: removed ticket %s of %s: %s", model_name, mv.version,
                        _holder(mv.tags), why)
            try:
                c.delete_model_version(name, str(mv.version))
            except Exception as exc:
                if not is_not_found(exc):
                    raise
        if not present:
            log.warning("promotion lock of %s: ticket %s was removed by another promoter; taking a new one",
                        model_name, mine)
            ticket[0] = _take(c, name, tags, lease_s)
            continue
        if not ahead:
            return
        if time.monotonic() > deadline:
            raise LockTimeoutError(f"{model_name}: promotion lock {name!r} still held by {_holder(ahead[0].tags)} "
                                   f"after {timeout_s:g} s")
        time.sleep(poll_s)
