"""Elastic membership: two torchrun agents on 127.0.0.1 (``--nnodes 1:2``, one CPU worker each,
one shared --out); one agent is SIGKILLed mid-run, as when its host dies. The survivor re-forms a
world of one and finishes from the last checkpoint, without a person."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN
from tests.engine_helpers import free_port
from training.checkpoint import latest_identity

pytestmark = pytest.mark.fault

CONFIG = "tests/configs/elastic.yaml"  # checkpoints every 5 steps; a dead agent noticed in 3 s, 5 s last call


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (TCPStore binds dual-stack: tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _holds_socket(pid: int, inodes: set[str]) -> bool:
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes:
                return True
        except OSError:
            continue
    return False


def _agent(launcher: subprocess.Popen) -> int:
    """The torchrun agent (``training.agent``) that ``trainflow train`` started."""
    return int(Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()[0])


def test_survivor_of_a_killed_agent_finishes_alone_from_the_last_checkpoint(bundled_data, repo_root, tmp_path):
    port, out = free_port(), tmp_path / "shared"
    cmd = [str(VENV_BIN / "trainflow"), "train", "--config", CONFIG, "--out", str(out), "--nnodes", "1:2",
           "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"elastic-{port}"]
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]  # files, not pipes: nobody reads them mid-run
    agents = [subprocess.Popen(cmd, cwd=repo_root, stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
    try:
        deadline = time.monotonic() + 180
        while ((latest_identity(out / "checkpoints") or {}).get("layout") or {}).get("world_size") != 2:
            assert all(a.poll() is None for a in agents), "an agent ended before a checkpoint of the world of 2"
            assert time.monotonic() < deadline, "no checkpoint of the world of 2 within 180 s"
            time.sleep(0.05)
        # Both agents started together; the one that bound the endpoint first hosts the c10d store,
        # which the survivor needs to re-form (a job over c10d survives any agent but that one).
        store = _listening_inodes(port)
        hosts = [_holds_socket(_agent(a), store) for a in agents]
        assert sorted(hosts) == [False, True], hosts
        victim, survivor = agents if hosts[1] else agents[::-1]
        os.kill(_agent(victim), signal.SIGKILL)  # its worker follows (bound to the agent)
        assert survivor.wait(timeout=180) == 0, logs[agents.index(survivor)].read_text()[-3000:]
        assert victim.wait(timeout=60) == 1  # that node's own launcher reports its agent's death
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "completed" and result["world_size"] == 1
    assert result["restarts"] == 1  # the departure cost the survivor one torchrun restart
    assert result["resumed_from_step"] >= 5
    assert result["resized_from"]["world_size"] == 2  # needs h13a's resize record in result.json
