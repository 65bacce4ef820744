from core.config import GatesConfig
from evaluation.gates import decide

GATES = GatesConfig(min_accuracy=0.9, min_macro_f1=0.9, min_class_recall=0.8, max_latency_p95_ms=5, max_regression=0.01)
GOOD = {"accuracy": 0.95, "macro_f1": 0.95, "min_class_recall": 0.9, "latency_p95_ms": 1.0}


def test_good_candidate_passes_without_champion():
    d = decide(GOOD, GATES)
    assert d.passed and d.failures == [] and len(d.checks) == 4


def test_every_failed_threshold_is_listed_with_value_and_threshold():
    bad = {"accuracy": 0.5, "macro_f1": 0.4, "min_class_recall": 0.1, "latency_p95_ms": 9.0}
    d = decide(bad, GATES)
    assert not d.passed
    assert [c.name for c in d.failures] == ["accuracy", "macro_f1", "min_class_recall", "latency_p95_ms"]
    reasons = d.reasons()
    assert "accuracy = 0.5000, needs >= 0.9000" in reasons[0]
    assert "latency_p95_ms = 9.0000, needs <= 5.0000" in reasons[3]


def test_champion_regression_beyond_delta_fails():
    champ = {"accuracy": 0.99, "macro_f1": 0.99}
    d = decide(GOOD, GATES, champ, "3")
    assert not d.passed
    names = [c.name for c in d.failures]
    assert names == ["accuracy_vs_champion", "macro_f1_vs_champion"]
    assert d.to_dict()["champion_version"] == "3"
    assert abs(d.failures[0].threshold - 0.98) < 1e-12


def test_champion_regression_within_delta_passes():
    champ = {"accuracy": 0.955, "macro_f1": 0.955}
    assert decide(GOOD, GATES, champ, "1").passed
