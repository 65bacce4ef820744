"""A torchrun job started held (``training.held.start_held``): it trains only after ``go``, exactly
as an ordinary launch would, and exits untrained on ``abort`` or when its launcher dies."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.config import load_config
from tests.engine_helpers import ROOT, TEST_CONFIGS, processes_mentioning
from training.held import start_held
from training.launcher import make_spec, start_job

pytestmark = pytest.mark.integration

QUICK = TEST_CONFIGS / "digits-quick.yaml"  # two epochs, bounded


def _spec(out: Path, env=None):
    return make_spec(load_config(QUICK), out, ROOT, "test-data-md5", env=env, nproc=2)


def _wait_exit(job, timeout_s: float = 60) -> int:
    return job.proc.wait(timeout=timeout_s)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One ordinary launch of the quick config, shared by three tests: started with ``start_job``,
    waited for with ``finish(at_result=True)`` (test_finish_at_result_...), with the pipeline's
    scoring on (test_the_workers_scores_...: rank 0 scores the test split after training, which
    changes no weight), and the plain launch the held job must match (test_a_held_job_...).
    ``(job, result, out)``; the job's exiting processes are reaped in the background."""
    from training.launcher import SCORE_ENV

    out = tmp_path_factory.mktemp("plain") / "early"
    job = start_job(_spec(out, env={SCORE_ENV: "1"}))
    return job, job.finish(at_result=True), out


def test_a_held_job_trains_after_go_to_the_same_weights_as_a_plain_launch(tmp_path, plain):
    job = start_held(_spec(tmp_path / "held"))
    time.sleep(3)  # the workers are up (or getting there) and must be waiting, not training
    assert job.waiting and job.job.proc.poll() is None
    assert not (tmp_path / "held" / "checkpoints").exists() and not (tmp_path / "held" / "result.json").exists()
    held = job.go().finish()
    _, plain_result, _ = plain
    assert held["status"] == plain_result["status"] == "completed"
    assert held["steps"] == plain_result["steps"]
    assert held["weights_sha256"] == plain_result["weights_sha256"]  # deterministic: the hold changes nothing
    assert json.loads((tmp_path / "held" / "go.json").read_text())["go"] is True


def test_an_aborted_held_job_exits_without_training_or_writing(tmp_path):
    out = tmp_path / "aborted"
    job = start_held(_spec(out))
    time.sleep(2)
    # A grace long enough for workers still importing torch on a loaded machine to read the abort.
    job.abort("validation failed", grace_s=120)
    assert _wait_exit(job.job) == 0  # the workers chose to exit: not a failure, not a kill
    assert not (out / "checkpoints").exists()
    assert not (out / "result.json").exists() and not (out / "weights.pt").exists()
    assert processes_mentioning(str(out)) == []


def test_a_held_job_exits_when_its_launcher_dies(tmp_path):
    out = tmp_path / "orphan"
    code = ("import sys, time; from pathlib import Path; sys.path.insert(0, sys.argv[2]);"
            "from tests.integration.test_prelaunch import _spec; from training.held import start_held;"
            "job = start_held(_spec(Path(sys.argv[1]))); print(job.job.proc.pid, flush=True); time.sleep(600)")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(out), str(ROOT)], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True)
    try:
        agent = int(launcher.stdout.readline())
        time.sleep(2)
    finally:
        launcher.kill()
        launcher.wait()
    deadline = time.monotonic() + 90
    while processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_mentioning(str(out)) == [], f"torchrun agent {agent} or its workers outlived the launcher"
    assert not (out / "checkpoints").exists() and not (out / "result.json").exists()


def test_the_flow_takes_only_the_job_it_would_launch_itself(tmp_path, monkeypatch):
    from flows.prelaunch import Prelaunch, job_key

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    early = Prelaunch.start(QUICK, [], 2)
    assert early is not None and early.slot.held.waiting
    held = early.slot
    cfg = load_config(QUICK)
    other = load_config(QUICK, ["training.lr=0.001"])
    md5 = held.held.job.spec.data_md5
    assert early.take(job_key(other, md5, 2, ROOT)) is None  # other inputs: aborted, not used
    # It exits before its first step; on a loaded machine the abort's grace (10 s) may end first
    # and the job is killed (SIGTERM to its group; torchrun's agent then exits 1 or dies of the
    # signal): either way it never trained.
    assert _wait_exit(held.held.job) in (0, 1, -signal.SIGTERM)
    assert not (held.folder / "result.json").exists()
    assert json.loads((held.folder / "go.json").read_text())["go"] is False
    assert early.take(job_key(cfg, md5, 2, ROOT)) is None  # nothing held any more

    again = Prelaunch.start(QUICK, [], 2)
    slot = again.slot
    assert slot.folder == held.folder  # the aborted job left its folder free and clean
    assert again.take(job_key(cfg, md5, 2, ROOT)) is slot
    again.abort("the flow ended")  # taken: the flow owns it now, the CLI's abort leaves it alone
    assert slot.held.waiting and slot.held.job.proc.poll() is None
    slot.abort("test over")
    # As above: the workers exit before their first step, or the grace ends first and the agent
    # is SIGTERMed (exit 1 or death by the signal); it never trains either way.
    assert _wait_exit(slot.held.job) in (0, 1, -signal.SIGTERM)
    assert not (slot.folder / "result.json").exists()


def test_no_early_launch_when_opted_out_or_the_world_needs_a_probe(tmp_path, monkeypatch):
    from flows.prelaunch import Prelaunch

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRAINFLOW_PRELAUNCH", "0")
    assert Prelaunch.start(QUICK, [], 2) is None
    monkeypatch.delenv("TRAINFLOW_PRELAUNCH")
    # cpu_workers: auto with no saved sweep: resolve probes the layouts first, so no guess is launched
    assert Prelaunch.start(QUICK, ["training.cpu_workers=auto"], None) is None
    assert not (tmp_path / "home" / "train").exists()


@pytest.mark.skipif(__import__("training.layouts").layouts.maybe_gpu(), reason="a GPU host: torch counts the GPUs")
def test_the_world_of_a_cpu_host_is_known_without_importing_torch():
    # The early launch waits on this decision; torch's import (1.5-2 s) is the workers' to pay.
    code = ("import sys; from core.config import load_config; from training.launcher import default_nproc;"
            "print(default_nproc(load_config('configs/digits.yaml', [])), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]


def test_finish_at_result_returns_the_final_result_and_the_job_is_reaped(plain):
    from training.launcher import reap_exiting

    job, result, out = plain  # start_job(...).finish(at_result=True)
    assert result["status"] == "completed" and (out / "model.pt2").is_file()
    assert result == {**json.loads((out / "result.json").read_text()),
                      "wall_s": result["wall_s"], "out_dir": str(out)}
    reap_exiting()  # what the process does at exit: nothing of the job outlives it
    assert job.proc.returncode == 0
    assert processes_mentioning(str(out)) == []


def test_the_workers_scores_are_the_pipelines_own_and_are_refused_for_another_program(tmp_path, plain):
    import shutil

    from evaluation.evaluate import evaluate_predictions, worker_scores
    from tasks import get_task
    from training.launcher import SCORES_FILE

    _, _, out = plain  # trained with SCORE_ENV=1: rank 0 wrote SCORES_FILE before result.json
    cfg = load_config(QUICK)
    task = get_task(cfg.task)
    scored = worker_scores(task, cfg, ROOT, out)
    assert scored is not None and scored["outputs_shape"] == [len(scored["pred"]), 10]
    by_worker = evaluate_predictions(task, cfg, ROOT, out, tmp_path / "ev-worker")
    unscored = tmp_path / "unscored"  # the same program without the worker's scores: loaded here
    shutil.copytree(out, unscored, ignore=shutil.ignore_patterns(SCORES_FILE, "checkpoints", "torchrun"))
    here = evaluate_predictions(task, cfg, ROOT, unscored, tmp_path / "ev-here")
    assert (by_worker["candidate_scored_in"], here["candidate_scored_in"]) == ("worker", "pipeline")
    for key in ("accuracy", "macro_f1", "min_class_recall", "confusion_matrix", "class_recall"):
        assert by_worker["candidate"][key] == here["candidate"][key], key
    assert by_worker["candidate"]["latency_p95_ms"] > 0
    assert by_worker["baseline"] == here["baseline"] and by_worker["baseline"]["accuracy"] < 0.2
    # Scores of another program (the file changed since) are not used.
    (unscored / SCORES_FILE).write_bytes((out / SCORES_FILE).read_bytes())
    (unscored / "model.pt2").write_bytes((out / "model.pt2").read_bytes() + b"\0")
    assert worker_scores(task, cfg, ROOT, unscored) is None
    assert worker_scores(task, cfg, ROOT, tmp_path / "missing") is None


def test_a_classifier_pipeline_run_never_imports_torch_in_the_cli_process(cli_run):
    # The point of the scoring above: torch (with torch.export's loader, 2-4 s) is the workers' only.
    # The shared run registered its model too: MLflow's own serving check would import torch there.
    assert cli_run.summary["status"] == "registered"
    assert "TORCH_IMPORTED False" in cli_run.proc.stdout
