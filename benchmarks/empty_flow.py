"""The least a pipeline run can cost here: trainflow's Prefect and MLflow start-up around stages that do nothing.

As ``trainflow run`` does it (the offline environment, the temporary API server started before Prefect's
import unless ``PREFECT_API_URL`` is set, heartbeats only where a server outlives the run, one MLflow run
opened in ``resolve`` and ended by the flow, ``gc.freeze`` before exit), but each stage is an empty task:
no config, data, validation, training, scoring or registration. ``benchmarks/overhead.py --floor`` runs it
beside the pipeline. Prints ``FLOOR {json}`` with the process's own timings.

    TRAINFLOW_HOME=/tmp/h .venv/bin/python benchmarks/empty_flow.py
"""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (the repository on sys.path)

from core.env import apply_offline_env
from core.paths import project_root, tracking_uri, trainflow_home, under_home

STAGES = ("resolve", "validate", "train", "log-training", "evaluate", "gate", "register")


def main() -> None:
    t0 = time.perf_counter()
    home = trainflow_home(project_root())
    apply_offline_env(home)
    from flows.api_server import heartbeats_where_watched, start_api

    server = start_api(Path(os.environ["PREFECT_HOME"]))
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    from registry import store

    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (what resolve imports)

    t_import = time.perf_counter() - t0
    if server is not None:
        t_import += server.wait()

    @task(cache_policy=NO_CACHE)
    def stage(name: str) -> str:
        return name

    @task(name="resolve", cache_policy=NO_CACHE)
    def resolve() -> str:
        exp_id = store.configure(tracking_uri(home), "overhead-floor", under_home(home, "mlartifacts"))
        return store.start_run(exp_id, "empty", {})

    @flow(name="trainflow-empty")
    def empty() -> float:
        s = time.perf_counter()
        run_id = resolve()
        for name in STAGES[1:]:
            stage.with_options(name=name)(name)
        store.end_run(run_id, "FINISHED")
        return time.perf_counter() - s

    with heartbeats_where_watched():
        t_flow = empty()
    print("FLOOR " + json.dumps({"imports": round(t_import, 3), "flow": round(t_flow, 3),
                                 "total": round(time.perf_counter() - t0, 3)}), flush=True)
    gc.freeze()


if __name__ == "__main__":
    main()
