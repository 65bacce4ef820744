"""Running real torchrun jobs from tests: small, bounded, and leaving no process behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from core.config import load_config
from training.agent import WORKER_START_ENV
from training.launcher import launch
from training.plan import HostFacts, plan_launch

ROOT = Path(__file__).resolve().parents[1]
# Test configs extend the real ones (``extends:``) and give only what they change.
TEST_CONFIGS = ROOT / "tests" / "configs"
# Small, bounded jobs: a hung job fails the test in minutes, not after 15.
ENGINE_CONFIG = TEST_CONFIGS / "digits-engine.yaml"
# The bundled digit images (data/digit-images) the same way, with augmentation on.
IMAGE_ENGINE_CONFIG = TEST_CONFIGS / "digit-images-engine.yaml"


def train(out: Path, overrides=(), env=None, nproc: int = 2, force_resume: bool = False,
          config: Path = ENGINE_CONFIG) -> dict:
    cfg = load_config(config, list(overrides))
    return launch(plan_launch(cfg, HostFacts(), nproc), out, ROOT, "test-data-md5", env, force_resume).finish()


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != os.getpid() and \
                    text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LM_PROBE = ROOT / "tests" / "integration" / "probes" / "lm_probe.py"
LM_PROBE_MODULE = "tests.integration.probes.lm_probe"
# The byte LM under each model-parallel strategy with 2 processes (hybrid: dp2 x tp2 needs 4).
LM_LAYOUTS = {
    "tp": ["training.strategy=tp", "training.cpu_workers=2", "training.parallel.tp=2"],
    "pp": ["training.strategy=pp", "training.cpu_workers=2", "training.parallel.pp=2"],
    "hybrid": ["training.strategy=hybrid", "training.cpu_workers=4", "training.parallel.tp=2"],
}


def train_lm(out: Path, overrides=(), nproc: int = 1, env=None, force_resume: bool = False,
             timeout: float = 300) -> tuple[int, dict | None, str]:
    """Train the byte LM on token windows (tests/integration/probes/lm_probe.py) through the worker's
    ``train_and_report``: plain python for one process, real torchrun (CPU/gloo, ``training.agent``) for more.

    Returns (exit code, result.json or None, the job's stdout+stderr).
    """
    import json
    import subprocess
    import sys

    args = ["--out", str(out)]
    for item in overrides:
        args += ["--set", item]
    if force_resume:
        args.append("--force-resume")
    if nproc == 1:
        cmd = [sys.executable, str(LM_PROBE), *args]
    else:  # torchrun as the launcher runs it (training.agent), its workers forked (CPU)
        cmd = [sys.executable, "-m", "training.agent", "--standalone", f"--nproc-per-node={nproc}",
               "-m", LM_PROBE_MODULE, *args]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", WORKER_START_ENV: "fork",
                **(env or {})}
    # start_new_session: a timed-out job is killed as a group (torchrun and its workers).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        raise AssertionError(f"LM job timed out after {timeout} s:\n{log[-4000:]}") from None
    result_path = Path(out) / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() and proc.returncode == 0 else None
    return proc.returncode, result, log


def lm_ok(run: tuple[int, dict | None, str]) -> dict:
    """The result of a ``train_lm`` run, failing the test with the job's log tail when it failed."""
    rc, result, log = run
    assert rc == 0 and result is not None, f"job failed (rc {rc}):\n{log[-6000:]}"
    return result


def lm_runs(tmp_path_factory, layouts: dict[str, tuple[list, int]]):
    """``get(name)`` -> (result, out folder) of ``train_lm`` with ``layouts[name]`` = (overrides,
    nproc), each run started on first use and once per module (a module fixture returns it)."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            out = tmp_path_factory.mktemp(name) / "out"
            overrides, nproc = layouts[name]
            cache[name] = (lm_ok(train_lm(out, overrides, nproc=nproc)), out)
        return cache[name]

    return get
