"""Elastic membership: two torchrun agents on 127.0.0.1 (``--nnodes 1:2``, one CPU worker each,
one shared --out) lose one mid-run, SIGKILLed as when its host dies, or SIGTERMed as on a
preemption notice. The other re-forms a world of one and finishes from the last checkpoint,
without a person."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN
from tests.engine_helpers import free_port
from tests.waiting import wait_for
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


class _Pair:
    """Two ``trainflow train --nnodes 1:2`` agents started together on one shared --out."""

    def __init__(self, repo_root: Path, tmp_path: Path):
        self.port, self.out = free_port(), tmp_path / "shared"
        cmd = [str(VENV_BIN / "trainflow"), "train", "--config", CONFIG, "--out", str(self.out), "--nnodes", "1:2",
               "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{self.port}", "--rdzv-id", f"elastic-{self.port}"]
        self.logs = [tmp_path / f"agent{i}.log" for i in range(2)]  # files, not pipes: nobody reads them mid-run
        self.agents = [subprocess.Popen(cmd, cwd=repo_root, stdout=log.open("w"), stderr=subprocess.STDOUT)
                       for log in self.logs]

    def victim_and_survivor(self) -> tuple[subprocess.Popen, subprocess.Popen]:
        """Once a checkpoint of the world of 2 exists: (an agent that does not host the c10d store, the other).

        The agent that bound the endpoint first hosts the store that holds the rendezvous; the
        survivor needs it to re-form (a job over c10d survives any agent but that one).
        """
        def checkpoint_of_two() -> bool:
            assert all(a.poll() is None for a in self.agents), "an agent ended before a checkpoint of the world of 2"
            return ((latest_identity(self.out / "checkpoints") or {}).get("layout") or {}).get("world_size") == 2

        wait_for(checkpoint_of_two, 180, "a checkpoint of the world of 2", poll_s=0.05)
        store = _listening_inodes(self.port)
        hosts = [_holds_socket(_agent(a), store) for a in self.agents]
        assert sorted(hosts) == [False, True], hosts
        return tuple(self.agents if hosts[1] else self.agents[::-1])

    def log(self, agent: subprocess.Popen) -> str:
        return self.logs[self.agents.index(agent)].read_text()

    def stop(self) -> None:
        for a in self.agents:
            if a.poll() is None:
                a.kill()
                a.wait()

    def result(self) -> dict:
        return json.loads((self.out / "result.json").read_text())


@pytest.fixture
def pair(bundled_data, repo_root, tmp_path):
    started = _Pair(repo_root, tmp_path)
    yield started
    started.stop()


def test_survivor_of_a_killed_agent_finishes_alone_from_the_last_checkpoint(pair):
    victim, survivor = pair.victim_and_survivor()
    os.kill(_agent(victim), signal.SIGKILL)  # as if its host died; its worker follows (bound to the agent)
    assert survivor.wait(timeout=180) == 0, pair.log(survivor)[-3000:]
    assert victim.wait(timeout=60) == 1  # that node's own launcher reports its agent's death
    result = pair.result()
    assert result["status"] == "completed" and result["world_size"] == 1
    assert result["restarts"] == 1  # the departure cost the survivor one torchrun restart
    assert result["resumed_from_step"] >= 5
    assert result["resized_from"]["world_size"] == 2  # the checkpoint's writer, recorded by the resume


def test_a_preempted_node_checkpoints_and_the_other_carries_on_from_that_step(pair):
    victim, survivor = pair.victim_and_survivor()
    victim.send_signal(signal.SIGTERM)  # a preemption notice for that node only
    assert victim.wait(timeout=90) == 4, pair.log(victim)[-3000:]
    stopped = int(re.search(r"preempted at step (\d+)", pair.log(victim)).group(1))
    assert survivor.wait(timeout=180) == 0, pair.log(survivor)[-3000:]
    result = pair.result()
    assert result["status"] == "completed" and result["world_size"] == 1 and result["restarts"] == 1
    assert result["resumed_from_step"] == stopped  # from the checkpoint both wrote: no step lost
    assert result["resized_from"]["world_size"] == 2  # the checkpoint's writer, recorded by the resume
