"""One training launch as the pipeline makes it: ``start_job`` then ``finish(at_result=True)``, rank 0
scoring its own exported program, and the pipeline process itself never importing torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from core.config import load_config
from tests.engine_helpers import ROOT, TEST_CONFIGS, processes_mentioning
from training.launcher import make_spec, start_job
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.integration

QUICK = TEST_CONFIGS / "digits-quick.yaml"  # two epochs, bounded


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """One launch of the quick config with the pipeline's scoring on (rank 0 scores the test split
    after training), waited for as the pipeline does: ``(job, result, out)``; the job's exiting
    processes are reaped in the background."""
    from training.launcher import SCORE_ENV

    out = tmp_path_factory.mktemp("plain") / "job"
    plan = plan_launch(load_config(QUICK), HostFacts(), 2)
    job = start_job(make_spec(plan, out, ROOT, "test-data-md5", env={SCORE_ENV: "1"}))
    return job, job.finish(at_result=True), out


def test_the_world_of_a_cpu_host_is_known_without_importing_torch():
    # The pipeline sizes the job without torch: torch's import is the workers' to pay.
    code = ("import sys; from core.config import load_config; from training.plan import host_facts, plan_launch;"
            "cfg = load_config('configs/digits.yaml', []);"
            "print(plan_launch(cfg, host_facts(cfg, '.trainflow')).nproc_per_node, 'torch' in sys.modules)")
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
    from tasks.base import SCORES_FILE

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
    # The point of the scoring above: torch (with torch.export's loader) is the workers' only.
    # The shared run registered its model too: MLflow's own serving check would import torch there.
    assert cli_run.summary["status"] == "registered"
    assert "TORCH_IMPORTED False" in cli_run.proc.stdout
