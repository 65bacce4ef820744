"""What the worker guard (flows/worker_guard.py) adds to a flow run, against a real ``prefect server``.

    .venv/bin/python benchmarks/guard_overhead.py [--repeats 5]

It starts its own server in a temp folder, creates the locked ``process`` pool there and deploys
``train`` from this checkout; then times the guarded worker's check per run (the first also loads
the flow's module) and the pool's command on a run it refuses at its last check, minus a process
that imports only what Prefect's engine imports before it loads a flow, alternated. The last line
is ``guard_overhead_s=<process>``.
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from common import ROOT, free_port, parser, wait_healthy

BIN = Path(sys.executable).parent


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    from core.env import TELEMETRY_OFF

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    tmp = Path(tempfile.mkdtemp(prefix="guard-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRAINFLOW_"))}
    env.update(TELEMETRY_OFF, PREFECT_HOME=str(tmp / "home"), PREFECT_UI_ENABLED="false", PREFECT_API_URL=api,
               TRAINFLOW_REPO_DIR=str(ROOT), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        if not wait_healthy(api, server, 180):
            raise SystemExit("the Prefect server did not start")
        for cmd in ([str(BIN / "trainflow"), "pool", "create", "process"],
                    [str(BIN / "prefect"), "--no-prompt", "deploy", "--name", "train"]):
            subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
        dep = httpx.get(f"{api}/deployments/name/trainflow-pipeline/train", timeout=10).json()

        def scheduled(params: dict) -> str:
            body = {"parameters": {"params": params}, "enforce_parameter_schema": False,
                    "state": {"type": "SCHEDULED", "state_details": {"scheduled_time": "2099-01-01T00:00:00Z"}}}
            return httpx.post(f"{api}/deployments/{dep['id']}/create_flow_run", json=body, timeout=10).json()["id"]

        os.environ.update(PREFECT_API_URL=api, PREFECT_HOME=env["PREFECT_HOME"], **TELEMETRY_OFF)
        from prefect.client.orchestration import get_client

        from flows.worker_guard import Guard

        guard = Guard(ROOT)
        worker_ms = []
        with get_client(sync_client=True) as client:
            for _ in range(args.repeats + 1):
                run_id = scheduled({"config": "digits.yaml", "epochs": 3})
                start = time.perf_counter()
                run = client.read_flow_run(run_id)
                assert guard.check(run.model_dump(mode="json"),
                                   client.read_deployment(run.deployment_id).model_dump(mode="json")) is None
                worker_ms.append((time.perf_counter() - start) * 1000)
        template = httpx.get(f"{api}/work_pools/process", timeout=10).json()["base_job_template"]
        command = shlex.split(template["job_configuration"]["command"])
        baseline = [sys.executable, "-I", "-c", "import prefect.engine, prefect.flow_engine"]
        walls = {"guard": [], "engine_imports": []}
        for _ in range(args.repeats):
            for name, cmd in (("guard", command), ("engine_imports", baseline)):
                run_env = {**env, "PREFECT__FLOW_RUN_ID": scheduled({"nproc_per_node": 0})}
                start = time.perf_counter()
                proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True)
                walls[name].append(time.perf_counter() - start)
                assert proc.returncode == (1 if name == "guard" else 0), proc.stderr[-2000:]
    finally:
        server.terminate()
        server.wait(30)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"worker check: first {worker_ms[0]:.0f} ms (loads the flow), then median "
          f"{statistics.median(worker_ms[1:]):.0f} ms")
    print(f"guard process {med['guard']:.2f} s, engine imports alone {med['engine_imports']:.2f} s "
          f"(medians of {args.repeats}, alternated)")
    print(f"guard_overhead_s={med['guard'] - med['engine_imports']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
