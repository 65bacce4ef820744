"""Which champion scores count and whether the candidate takes @champion (evaluation.champion), on
the digits config's real task and test split; the registry's tags are plain mappings here."""

from pathlib import Path

import pytest

from core.config import load_config
from evaluation.champion import deserves, recorded_or_loaded
from evaluation.gates import beats
from evaluation.recorded import record_tags
from tasks import get_task

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config(ROOT / "configs" / "digits.yaml", [])
TASK = get_task(CFG.task).with_primary(CFG.primary_metric)


def scores(accuracy: float) -> dict:
    """A full set of the task's recorded scores."""
    s = {k: 0.5 for k in TASK.recorded_keys()}
    return {**s, "accuracy": accuracy, "macro_f1": accuracy, "confusion_matrix": [[1]], "class_recall": [1.0],
            "predicted_classes": 10, "n": 360}


def never_loaded():
    raise AssertionError("the champion was loaded although its scores were at hand")


@pytest.fixture(scope="module")
def key():
    return TASK.scoring_key(CFG, ROOT)


def test_a_champion_with_scores_recorded_on_this_split_is_not_loaded(key):
    champ = {"version": "3", "tags": record_tags(key, scores(0.9), TASK.recorded_keys())}
    recorded, loaded = recorded_or_loaded(TASK, CFG, ROOT, champ, never_loaded)
    assert recorded["accuracy"] == 0.9 and loaded is None
    assert recorded_or_loaded(TASK, CFG, ROOT, None, never_loaded) == (None, None)


def test_a_champion_scored_on_other_bytes_is_loaded_to_be_rescored(key):
    other = {**key, "key": "0" * 64}
    champ = {"version": "3", "tags": record_tags(other, scores(0.9), TASK.recorded_keys())}
    assert recorded_or_loaded(TASK, CFG, ROOT, champ, lambda: "the model") == (None, "the model")


def test_the_champion_evaluated_beside_the_candidate_decides_while_it_still_holds_the_alias(key):
    report = {"candidate": scores(0.95), "champion": scores(0.9), "champion_version": "3", "scoring_key": key}
    assert deserves(TASK, CFG, ROOT, report, {"version": "3", "tags": {}}, never_loaded) == \
        beats(TASK, scores(0.95), scores(0.9), CFG.gates.min_improvement)
    assert deserves(TASK, CFG, ROOT, report, None, never_loaded) == (True, "there is no champion")


def test_a_champion_moved_since_evaluation_is_judged_by_its_recorded_scores(key):
    report = {"candidate": scores(0.95), "champion": scores(0.9), "champion_version": "3", "scoring_key": key}
    moved = {"version": "4", "tags": record_tags(key, scores(0.97), TASK.recorded_keys())}
    ok, reason = deserves(TASK, CFG, ROOT, report, moved, never_loaded)
    assert not ok and reason.startswith("champion moved to v4 since evaluation (its recorded scores); ")
    assert reason.endswith(beats(TASK, scores(0.95), scores(0.97), CFG.gates.min_improvement)[1])
