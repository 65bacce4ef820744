"""The generic gate: thresholds, baseline and champion checks in each metric's direction."""

import pytest

from core.config import GatesConfig
from evaluation.gates import beats, decide
from tasks import get_task

CLS = get_task("classification")
REG = get_task("regression")
LM = get_task("lm")
GATES = GatesConfig(thresholds={"accuracy": 0.9, "macro_f1": 0.9, "min_class_recall": 0.8, "latency_p95_ms": 5},
                    max_regression=0.01)
GOOD = {"accuracy": 0.95, "macro_f1": 0.95, "min_class_recall": 0.9, "latency_p95_ms": 1.0}


def test_good_candidate_passes_without_champion():
    d = decide(CLS, GOOD, GATES)
    assert d.passed and d.failures == [] and len(d.checks) == 4


def test_every_failed_threshold_is_listed_with_value_and_threshold():
    bad = {"accuracy": 0.5, "macro_f1": 0.4, "min_class_recall": 0.1, "latency_p95_ms": 9.0}
    d = decide(CLS, bad, GATES)
    assert not d.passed
    assert [c.name for c in d.failures] == ["accuracy", "macro_f1", "min_class_recall", "latency_p95_ms"]
    reasons = d.reasons()
    assert "accuracy = 0.5000, needs >= 0.9000" in reasons[0]
    assert "latency_p95_ms = 9.0000, needs <= 5.0000" in reasons[3]


def test_champion_regression_beyond_delta_fails():
    champ = {"accuracy": 0.99, "macro_f1": 0.99}
    d = decide(CLS, GOOD, GATES, champ, "3")
    assert not d.passed
    names = [c.name for c in d.failures]
    assert names == ["accuracy_vs_champion", "macro_f1_vs_champion"]
    assert d.to_dict()["champion_version"] == "3"
    assert abs(d.failures[0].threshold - 0.98) < 1e-12


def test_champion_regression_within_delta_passes():
    champ = {"accuracy": 0.955, "macro_f1": 0.955}
    assert decide(CLS, GOOD, GATES, champ, "1").passed


def test_the_baseline_must_be_beaten_by_the_margin_on_the_primary_metric():
    gates = GatesConfig(baseline_margin=0.05)
    d = decide(CLS, {**GOOD, "accuracy": 0.4}, gates, baseline={"accuracy": 0.38})
    assert not d.passed and d.failures[0].name == "accuracy_vs_baseline"
    assert d.failures[0].threshold == pytest.approx(0.43) and d.failures[0].op == ">="
    assert decide(CLS, {**GOOD, "accuracy": 0.44}, gates, baseline={"accuracy": 0.38}).passed


def test_lower_is_better_metrics_gate_with_le_and_the_champion_above():
    gates = GatesConfig(thresholds={"rmse": 2.0, "r2": 0.5}, max_regression=0.1, baseline_margin=0.2)
    cand = {"r2": 0.8, "rmse": 1.5, "mae": 1.0, "latency_p95_ms": 1.0}
    d = decide(REG, cand, gates, {"r2": 0.95, "rmse": 1.3}, "2", baseline={"r2": 0.0})
    by = {c.name: c for c in d.checks}
    assert by["rmse"].op == "<=" and by["rmse"].passed
    assert by["r2_vs_baseline"].threshold == pytest.approx(0.2) and by["r2_vs_baseline"].passed
    assert by["rmse_vs_champion"].op == "<=" and by["rmse_vs_champion"].threshold == pytest.approx(1.4)
    assert not by["rmse_vs_champion"].passed and not by["r2_vs_champion"].passed
    assert [c.name for c in d.failures] == ["r2_vs_champion", "rmse_vs_champion"]


def _lm(ppl: float, latency: float = 1.0) -> dict:
    import math

    return {"perplexity": ppl, "loss": math.log(ppl), "bits_per_byte": math.log2(ppl), "latency_p95_ms": latency}


def test_a_relative_metric_allows_a_factor_of_the_champion():
    gates = GatesConfig(thresholds={"perplexity": 10.0, "latency_p95_ms": 20}, max_regression=0.05)
    d = decide(LM, _lm(12.0, latency=30.0), gates, _lm(8.0), "3")
    assert [c.name for c in d.failures] == ["perplexity", "latency_p95_ms", "perplexity_vs_champion"]
    assert d.failures[-1].threshold == pytest.approx(8.0 * 1.05) and d.failures[-1].op == "<="
    assert decide(LM, _lm(8.3), gates, _lm(8.0), "1").passed  # 3.75 % worse: allowed
    assert not decide(LM, _lm(8.5), gates, _lm(8.0), "1").passed  # 6.25 % worse


def test_beats_compares_champion_metrics_in_order_each_in_its_direction():
    assert beats(CLS, GOOD, None) == (True, "there is no champion")
    assert beats(CLS, GOOD, {"accuracy": 0.94, "macro_f1": 0.99})[0]
    assert not beats(CLS, GOOD, {"accuracy": 0.96, "macro_f1": 0.5})[0]
    ok, reason = beats(CLS, GOOD, {"accuracy": 0.95, "macro_f1": 0.95})  # equal: a tie keeps the champion
    assert not ok and "ties the champion's 0.9500 / 0.9500" in reason and "the champion stays" in reason
    assert not beats(CLS, GOOD, {"accuracy": 0.95, "macro_f1": 0.96})[0]
    assert beats(LM, _lm(8.0), _lm(8.5))[0] and not beats(LM, _lm(8.5), _lm(8.0))[0]
    ok, reason = beats(REG, {"r2": 0.9, "rmse": 1.0}, {"r2": 0.9, "rmse": 1.1})
    assert ok and "beats" in reason  # equal r2: the lower rmse wins


def test_a_candidate_must_beat_the_champion_by_more_than_min_improvement():
    champ = {"accuracy": 0.9861, "macro_f1": 0.9860}
    # An identical retrain (the first-hour report: "0.9861 / 0.9860 beats the champion's 0.9861 / 0.9860").
    ok, reason = beats(CLS, dict(champ), champ, 0.001)
    assert not ok and reason.startswith("accuracy / macro_f1 0.9861 / 0.9860 ties the champion's 0.9861 / 0.9860")
    # Accuracy +0.0008 is within the margin, so the next metric decides: macro_f1 +0.004 beats it,
    # +0.0005 ties too, and -0.002 loses.
    assert beats(CLS, {"accuracy": 0.9869, "macro_f1": 0.9900}, champ, 0.001)[0]
    assert not beats(CLS, {"accuracy": 0.9869, "macro_f1": 0.9865}, champ, 0.001)[0]
    assert not beats(CLS, {"accuracy": 0.9869, "macro_f1": 0.9840}, champ, 0.001)[0]
    assert beats(CLS, {"accuracy": 0.9875, "macro_f1": 0.90}, champ, 0.001)[0]  # accuracy +0.0014 decides first
    assert not beats(CLS, {"accuracy": 0.9850, "macro_f1": 0.9999}, champ, 0.001)[0]  # -0.0011: worse
    # A relative metric's margin is a factor of the champion's value: perplexity 8.0 -> 7.995 is 0.06 %.
    assert not beats(LM, _lm(7.995), _lm(8.0), 0.001)[0] and beats(LM, _lm(7.99), _lm(8.0), 0.001)[0]


def test_a_threshold_on_a_metric_the_task_lacks_is_a_config_error():
    from core.config import load_config
    from core.errors import ConfigError
    from tests.conftest import ROOT

    cfg = load_config(ROOT / "configs" / "digits.yaml", ["gates.thresholds.perplexity=3"])
    with pytest.raises(ConfigError, match=r"gates\.thresholds\.perplexity: task 'classification' has no metric"):
        CLS.check_config(cfg)


def test_max_gap_to_gbdt_fails_a_candidate_trailing_the_trees_by_more_than_the_gap():
    gates = GatesConfig(max_gap_to_gbdt=0.02)
    d = decide(CLS, GOOD, gates, gbdt={"accuracy": 0.98, "macro_f1": 0.96})  # 0.95 trails by 0.03
    (check,) = d.failures
    assert (check.name, check.value, check.op) == ("accuracy_vs_gbdt", 0.95, ">=")
    assert check.threshold == pytest.approx(0.96)
    assert decide(CLS, GOOD, gates, gbdt={"accuracy": 0.969}).passed  # within the gap
    assert decide(CLS, GOOD, GatesConfig(), gbdt={"accuracy": 0.99}).passed  # no gap set: reported, not gated
    reg = decide(REG, {"r2": 0.80, "rmse": 1.0, "mae": 1.0, "latency_p95_ms": 1.0}, GatesConfig(max_gap_to_gbdt=0.05),
                 gbdt={"r2": 0.90})
    assert [c.name for c in reg.failures] == ["r2_vs_gbdt"] and reg.failures[0].threshold == pytest.approx(0.85)
