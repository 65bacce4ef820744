"""The lock a promoter of a model holds while it reads ``@champion``, decides and moves it.

Two layers, taken in this order by every promoter (so no two can deadlock): a Prefect global
concurrency limit, only against a persistent Prefect server (its UI then shows who holds and who waits),
then the registry lease, always: hosts that share the MLflow server need not share a Prefect server,
and MLflow has no compare-and-set on aliases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from flows.api_server import persistent_api_url

# How long a promoter waits for the Prefect limit (the lease then has its own wait).
PREFECT_WAIT_S = 240.0


def limit_name(model_name: str) -> str:
    """The Prefect global concurrency limit that serialises ``model_name``'s promotions."""
    return f"promote-{model_name}"


@contextmanager
def promotion_lock(tracking_uri: str, home: Path, model_name: str) -> Iterator[None]:
    """Hold every layer of ``model_name``'s promotion lock for the block (``home``: named to whoever
    waits). Raises LockTimeoutError, naming the limit or the holder, when a layer stays taken too long."""
    from registry.lease import hold

    with ExitStack() as stack:
        if persistent_api_url():
            stack.enter_context(prefect_limit(model_name))
        stack.enter_context(hold(model_name, tracking_uri=tracking_uri, note=f"TRAINFLOW_HOME {home}"))
        yield


@contextmanager
def prefect_limit(model_name: str, timeout_s: float = PREFECT_WAIT_S) -> Iterator[None]:
    """Occupy the one slot of the global concurrency limit ``promote-<model_name>`` (created with
    limit 1 when missing) on the current Prefect API for the block."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.concurrency.sync import concurrency
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from core.locks import LockTimeoutError

    name = limit_name(model_name)
    with get_client(sync_client=True) as client:
        try:  # read first: a create that collides makes the server log a traceback
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:  # another promoter created it meanwhile
                pass
    with ExitStack() as stack:
        try:
            # strict: a limit deleted since the line above fails here rather than being skipped.
            # No failure on a missed lease renewal: the registry lease underneath still guards.
            stack.enter_context(concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True,
                                            holder=_holder(), raise_on_lease_renewal_failure=False))
        except TimeoutError as exc:
            raise LockTimeoutError(f"{model_name}: Prefect concurrency limit {name!r} still full after "
                                   f"{timeout_s:g} s (Prefect UI: Concurrency)") from exc
        yield


def _holder():
    """The task run (or flow run) that holds the slot, as the Prefect UI shows it; None outside one."""
    from prefect.client.schemas.objects import ConcurrencyLeaseHolder
    from prefect.context import FlowRunContext, TaskRunContext

    if (task_ctx := TaskRunContext.get()) is not None:
        return ConcurrencyLeaseHolder(type="task_run", id=task_ctx.task_run.id)
    if (flow_ctx := FlowRunContext.get()) is not None and flow_ctx.flow_run is not None:
        return ConcurrencyLeaseHolder(type="flow_run", id=flow_ctx.flow_run.id)
    return None
