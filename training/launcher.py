"""Launch a training job with torchrun as a subprocess and collect its result.

A subprocess (not ``elastic_launch`` in-process) keeps a crashed or hung job
killable as one process group, and keeps torch's global state out of the
caller (a Prefect worker, a test). Failures come back as ``TrainingFailedError``
naming the first failing rank with its traceback, read from torchrun's error
files (the worker's main is wrapped in ``@record``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.config import PipelineConfig
from core.errors import TrainingFailedError


@dataclass(frozen=True)
class JobSpec:
    """Everything needed to run (and rerun) one training job; written to ``<out>/job.json``."""

    config_path: str
    out_dir: str
    root: str
    data_md5: str
    nproc_per_node: int
    nnodes: int = 1
    max_restarts: int = 0
    timeout_s: float = 900.0
    threads_per_worker: int = 1
    env: dict[str, str] = field(default_factory=dict)

    def command(self, log_dir: Path) -> list[str]:
        cmd = [sys.executable, "-m", "torch.distributed.run",
               f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}",
               f"--max-restarts={self.max_restarts}", f"--log-dir={log_dir}"]
        if self.nnodes == 1:
            cmd.append("--standalone")  # local c10d rendezvous on a free port
        return cmd + ["-m", "training.worker", "--config", self.config_path, "--out", self.out_dir,
                      "--root", self.root, "--data-md5", self.data_md5]


def default_nproc(cfg: PipelineConfig) -> int:
    """One worker per GPU when CUDA is present, else ``training.cpu_workers``."""
    import torch

    if cfg.training.backend != "gloo" and torch.cuda.is_available():
        return torch.cuda.device_count()
    return cfg.training.cpu_workers


def make_spec(cfg: PipelineConfig, out_dir: Path, root: Path, data_md5: str,
              env: dict[str, str] | None = None, nproc: int | None = None) -> JobSpec:
    """Write the resolved config into ``out_dir`` and describe the job that trains it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.yaml"
    config_path.write_text(cfg.to_yaml())
    return JobSpec(
        config_path=str(config_path), out_dir=str(out_dir), root=str(root), data_md5=data_md5,
        nproc_per_node=nproc or default_nproc(cfg), max_restarts=cfg.training.max_restarts,
        timeout_s=cfg.training.timeout_s, threads_per_worker=cfg.training.threads_per_worker,
        env=dict(env or {}),
    )


def _first_failure(log_dir: Path, nproc: int) -> tuple[int | None, str, str]:
    """(rank, message, traceback) of the earliest error file torchrun's workers wrote."""
    found = []
    for path in log_dir.glob("*/attempt_*/*/error.json"):
        try:
            data = json.loads(path.read_text())
            msg = data["message"]
            if isinstance(msg, str):  # some versions store the payload as a JSON string
                msg = json.loads(msg)
            info = msg.get("extraInfo", {})
            stamp = int(info.get("timestamp", 0))
            attempt = int(path.parent.parent.name.split("_")[1])
            found.append((attempt, stamp, int(path.parent.name), msg.get("message", ""), info.get("py_callstack", "")))
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            continue
    if not found:
        return None, "", ""
    last_attempt = max(f[0] for f in found)
    _, _, local_rank, message, tb = min(f for f in found if f[0] == last_attempt)
    return local_rank, message, tb


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_job(spec: JobSpec) -> dict:
    """Run torchrun for ``spec``; return ``result.json`` (plus ``wall_s``). Raises TrainingFailedError."""
    out = Path(spec.out_dir)
    log_dir = out / "torchrun"
    (out / "job.json").write_text(json.dumps(asdict(spec), indent=2))
    env = {**os.environ, **spec.env, "OMP_NUM_THREADS": str(spec.threads_per_worker)}
    t0 = time.perf_counter()
    proc = subprocess.Popen(spec.command(log_dir), cwd=spec.root, env=env, start_new_session=True)
    try:
        rc = proc.wait(timeout=spec.timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise TrainingFailedError(f"training exceeded training.timeout_s={spec.timeout_s:g}s and was killed") from None
    except BaseException:  # Ctrl-C, task cancellation: leave no worker behind
        _kill_group(proc)
        raise
    wall = time.perf_counter() - t0
    if rc != 0:
        rank, message, tb = _first_failure(log_dir, spec.nproc_per_node)
        where = f"rank {rank}" if rank is not None else "a worker"
        detail = f": {message}" if message else f" (torchrun exit code {rc}; see {log_dir})"
        raise TrainingFailedError(f"training failed on {where}{detail}", rank=rank, traceback=tb)
    result_path = out / "result.json"
    if not result_path.is_file():
        raise TrainingFailedError(f"torchrun exited 0 but wrote no {result_path}")
    result = json.loads(result_path.read_text())
    result["wall_s"] = wall
    result["out_dir"] = str(out)
    return result
