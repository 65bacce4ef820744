"""SIGKILL of ``trainflow run`` mid-training: no process of the run outlives it for long, its
training folder is never handed to a second job while the first is alive, and the next run
completes in that folder. And its torchrun agent, SIGTERMed again while it stops its workers
(what a killed multi-threaded launcher can do), still stops them.

The killed run's workers hang at a step (``TRAINFLOW_FAULT=hang``), so they ignore the SIGTERM
that asks them to checkpoint: the worst case, which only the grace period ends. The run's
processes are found by an environment marker every descendant inherits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from core.procs import pid_alive
from tests.conftest import VENV_BIN
from tests.engine_helpers import ROOT
from tests.integration.live import marked_processes
from tests.waiting import wait_for

pytestmark = pytest.mark.fault

MARK = "TRAINFLOW_TEST_RUN_MARK"
CONFIG = "tests/configs/orphans.yaml"  # checkpoints at steps 4 and 8, a 5 s preemption grace
HANG = "hang@step=10"  # after the checkpoints of steps 4 and 8


def _run_processes(marker: str) -> dict[int, str]:
    return marked_processes(MARK, marker)


def _cli(home: Path, tmp: Path, marker: str, **extra) -> tuple[list[str], dict]:
    env = {**os.environ, "TRAINFLOW_HOME": str(home), "PREFECT_HOME": str(tmp / "prefect"), MARK: marker, **extra}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "TRAINFLOW_FAULT"):
        if name not in extra:
            env.pop(name, None)
    cmd = [str(VENV_BIN / "trainflow"), "run", "--config", CONFIG, "--summary-json", str(tmp / f"summary-{marker}.json")]
    return cmd, env


def _second_claim(repo_root: Path, home: Path) -> tuple[Path, Path]:
    """(the inputs' own folder, the folder a second run with the same inputs would train in now)."""
    from core.config import load_config
    from core.locks import release
    from core.manifest import read_dvc_file
    from training.plan import host_facts, plan_launch
    from training.slots import claim_train_dir, slot_base

    cfg = load_config(repo_root / CONFIG)
    cfg = plan_launch(cfg, host_facts(cfg, home), 2).cfg
    inputs = (home, cfg.name, cfg.config_id(), read_dvc_file(repo_root, cfg.dataset.dvc_file).md5, 2)
    folder, fd = claim_train_dir(*inputs)
    release(fd)
    return slot_base(*inputs), folder


@pytest.fixture(scope="module")
def killed_run(repo_root, bundled_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("orphans")
    home, marker = tmp / "home", uuid.uuid4().hex
    cmd, env = _cli(home, tmp, marker, TRAINFLOW_FAULT=HANG)
    with open(tmp / "killed.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=repo_root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        def checkpointed() -> list[Path]:  # training is under way
            assert proc.poll() is None, (tmp / "killed.log").read_text()[-3000:]
            return sorted(home.glob("train/*/checkpoints/step_*/COMPLETE"))

        done = wait_for(checkpointed, 240, "the run's first checkpoint", poll_s=0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        folder = done[0].parents[2]
        base, claimed = _second_claim(repo_root, home)
        assert base == folder, f"the killed run trained in {folder.name}, not in its inputs' folder {base.name}"
        alive_at_claim = _run_processes(marker)
        with contextlib.suppress(AssertionError):  # what is left is named by the test
            wait_for(lambda: not _run_processes(marker), 60, "the killed run's processes to end", poll_s=0.2)
        yield {"tmp": tmp, "home": home, "folder": folder, "claimed": claimed, "alive_at_claim": alive_at_claim,
               "left_after_60s": _run_processes(marker)}
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _run_processes(marker):  # only ever needed where the run left orphans behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_second_claim_never_gets_the_folder_a_live_job_holds(killed_run):
    assert killed_run["alive_at_claim"], "the killed run's job had stopped before the claim: nothing tested"
    assert killed_run["claimed"] != killed_run["folder"], (
        f"{killed_run['folder'].name} was handed to a second run while {len(killed_run['alive_at_claim'])} "
        f"process(es) of the killed run still used it: {sorted(killed_run['alive_at_claim'].values())}")


def test_sigkill_of_run_leaves_no_process_alive_and_the_next_run_completes(killed_run, repo_root):
    left = killed_run["left_after_60s"]
    assert left == {}, f"{len(left)} process(es) of the killed run alive 60 s later: {sorted(left.values())}"

    tmp, marker = killed_run["tmp"], uuid.uuid4().hex
    cmd, env = _cli(killed_run["home"], tmp, marker)
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp / f"summary-{marker}.json").read_text())["status"] == "registered"
    # Freed once the job was gone: the next run took the same folder and resumed its checkpoint.
    result = json.loads((killed_run["folder"] / "result.json").read_text())
    assert result["status"] == "completed" and result["resumed_from_step"] is not None
    assert _run_processes(marker) == {}


def test_an_agent_signalled_again_while_it_stops_its_workers_still_stops_them(tmp_path):
    """The kernel sends a parent-death signal again each time the orphan is handed to another
    thread of its dying launcher, so a killed multi-threaded ``trainflow run`` can SIGTERM its
    agent several times (seen: three, on a loaded machine). torchrun raises at every one, and one
    raised while it was stopping its workers broke off the stop before the SIGKILL: the agent then
    waited at exit for workers that ignore SIGTERM, and both lived on. Here: workers that ignore
    SIGTERM, and three SIGTERMs while the agent waits out its 2 s grace."""
    from training.agent import WORKER_START_ENV

    pids = tmp_path / "pids"
    pids.mkdir()
    env = {**os.environ, WORKER_START_ENV: "fork", "PYTHONPATH": str(ROOT)}
    cmd = [str(VENV_BIN / "python"), "-m", "training.agent", "--nnodes=1", "--nproc-per-node=2",
           "--max-restarts=0", f"--log-dir={tmp_path / 'logs'}", "--shutdown-timeout=2", "--standalone",
           "-m", "tests.fault.stubborn_worker", str(pids)]
    with open(tmp_path / "agent.log", "wb") as log:
        agent = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    workers: list[int] = []
    try:
        def started() -> list[int]:
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            found = [int(p.read_text()) for p in pids.glob("rank*.pid") if p.read_text()]
            return found if len(found) >= 2 else []

        workers = wait_for(started, 60, "both stubborn workers to start", poll_s=0.1)
        # The first SIGTERM starts the stop; the others come once torchrun has sent its workers their
        # SIGTERM, so while it waits out the grace for them (its log says so for each).
        agent.send_signal(signal.SIGTERM)
        wait_for(lambda: (tmp_path / "agent.log").read_text().count("via signal SIGTERM") >= 2, 30,
                 "torchrun to send its workers SIGTERM", poll_s=0.01)
        for _ in range(2):
            agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the agent still ran 20 s after its SIGTERMs:\n" + (tmp_path / "agent.log").read_text()[-3000:])
        with contextlib.suppress(AssertionError):  # named below
            wait_for(lambda: not any(pid_alive(p) for p in workers), 5, "the workers to end with their agent")
        left = [p for p in workers if pid_alive(p)]
        assert left == [], f"workers {left} outlived their agent"
    finally:
        for pid in [agent.pid, *workers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
