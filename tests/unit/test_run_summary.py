"""The typed run summary (core.summary): each stage's result fills its section, an ending says what
it carries, and its JSON form has the keys summary.json and the CLI's table read."""

import pytest

from core.errors import DataValidationError, GateRejectedError, PreemptedError
from core.summary import ALWAYS, TRAINING_KEYS, RunSummary
from tasks import get_task

TASK = get_task("classification").with_primary("accuracy")
RESULT = {**{k: 1 for k in TRAINING_KEYS}, "wall_s": 7.5, "out_dir": "/state/train/x", "goodput": None}


def opened() -> RunSummary:
    return RunSummary("sqlite:///m.db", "a" * 32, "flow-run", "digits-classifier", {"config_name": "digits"})


def scores(accuracy: float) -> dict:
    return {m.name: accuracy for m in TASK.metrics}


def test_an_opened_run_shows_only_what_every_run_has():
    s = opened().to_dict()
    assert set(s) == set(ALWAYS) and s["status"] == "running" and s["model_version"] is None


def test_a_registered_run_carries_every_stage_section():
    s = opened()
    s.validated({"n_expectations": 7, "cached": False, "report_md": "v/summary.md"}, None)
    s.trained(RESULT, {"goodput": 0.9}, "curves.png")
    ev = {"candidate": {**scores(0.95), "threshold": 0.4}, "champion": scores(0.9), "champion_version": "2",
          "champion_scores": "recorded", "candidate_scored_in": "worker", "files": {"confusion_matrix": "cm.png"},
          "baseline": {"predictor": "majority", **scores(0.1)}, "gbdt": None}
    s.evaluated(TASK, ev, RESULT["wall_s"])
    s.gates = [{"name": "accuracy", "passed": True}]
    s.registered({"version": "3", "aliases": ["champion"], "promotion": None}, RESULT["out_dir"])
    d = s.to_dict()
    assert d["status"] == "registered" and d["exit_code"] == 0 and d["model_version"] == "3"
    assert d["validation"]["success"] and d["training"]["wall_s"] == 7.5 and d["training"]["goodput"] == {"goodput": 0.9}
    assert d["plots"] == {"training_curves": "curves.png", "confusion_matrix": "cm.png"}
    assert d["metrics"] == scores(0.95) and d["candidate_scored_in"] == "worker"
    assert d["champion"] == {"version": "2", "scores": "recorded", **scores(0.9)}
    assert d["threshold"] == {"value": 0.4, "tuned_for": TASK.threshold_metric()}
    assert d["baseline"]["predictor"] == "majority" and d["baseline"]["primary"] == "accuracy"
    assert "gbdt" not in d and "error" not in d
    assert "promotion" in d and d["promotion"] is None  # manual promotion: said, not left out


@pytest.mark.parametrize("exc, status, code", [
    (DataValidationError("2 checks", {"failures": [{"message": "x"}], "report_md": "r.md"}), "validation_failed", 2),
    (GateRejectedError("rejected", {"checks": [{"name": "accuracy", "passed": False}]}), "rejected", 3),
    (PreemptedError("preempted"), "preempted", PreemptedError.exit_code),
    (RuntimeError("boom"), "failed", 1),
])
def test_an_ending_says_what_stopped_the_run(exc, status, code):
    s = opened()
    s.failed(exc)
    d = s.to_dict()
    assert (d["status"], d["exit_code"], d["error"]) == (status, code, str(exc))
    assert "training" not in d and "promotion" not in d
    if status == "validation_failed":
        assert d["validation"] == {"success": False, "report": "r.md", "failures": [{"message": "x"}],
                                   "warnings": [], "skipped": []}
    if status == "rejected":
        assert d["gates"] == [{"name": "accuracy", "passed": False}]


def test_the_runs_timings_completed_after_it_ended_are_in_its_summary():
    s = opened()
    d = s.to_dict()
    s.timings["flow"] = 1.5  # the flow's own time, taken as it returns
    assert d["timings"] == {"flow": 1.5}
