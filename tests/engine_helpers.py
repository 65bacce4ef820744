"""Running real torchrun jobs from tests: small, bounded, and leaving no process behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from core.config import load_config
from training.launcher import make_spec, run_job

ROOT = Path(__file__).resolve().parents[1]
# Small, bounded jobs: a hung job fails the test in minutes, not after 15.
BASE = ["training.timeout_s=180", "training.collective_timeout_s=60"]


def train(out: Path, overrides=(), env=None, nproc: int = 2, force_resume: bool = False) -> dict:
    cfg = load_config(ROOT / "configs" / "digits.yaml", [*BASE, *overrides])
    spec = make_spec(cfg, out, ROOT, "test-data-md5", env=env, nproc=nproc, force_resume=force_resume)
    return run_job(spec)


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
