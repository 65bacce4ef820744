"""The gate: absolute thresholds plus "no worse than the champion by more than delta".

``decide`` returns every check with its measured value and threshold, never just "failed".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from core.config import GatesConfig


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    threshold: float
    op: str  # ">=" or "<="
    passed: bool
    note: str = ""  # what a failure means, when the figures alone do not say it

    def reason(self) -> str:
        return f"{self.name} = {self.value:.4f}, needs {self.op} {self.threshold:.4f}" + (
            f" ({self.note})" if self.note and not self.passed else "")


@dataclass(frozen=True)
class GateDecision:
    passed: bool
    checks: tuple[Check, ...]
    champion_version: str | None

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.passed]

    def reasons(self) -> list[str]:
        return [c.reason() for c in self.failures]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "champion_version": self.champion_version,
                "checks": [asdict(c) for c in self.checks], "reasons": self.reasons()}


def _check(name: str, value: float, threshold: float, op: str, note: str = "") -> Check:
    ok = value >= threshold if op == ">=" else value <= threshold
    return Check(name, float(value), float(threshold), op, bool(ok), note)


def decide(task, candidate: dict, gates: GatesConfig, champion: dict | None = None,
           champion_version: str | None = None, baseline: dict | None = None,
           gbdt: dict | None = None) -> GateDecision:
    """Apply every gate to ``candidate`` metrics, each in the direction the task gives it.

    * ``gates.thresholds``: ``metric >= bound`` where higher is better, ``<=`` where lower is;
    * ``gates.baseline_margin``: the primary metric beats the trivial ``baseline`` by the margin;
    * ``gates.max_gap_to_gbdt``: the primary metric trails the ``gbdt`` scores by at most the gap;
    * ``gates.max_gap_to_baseline``: the same against the task's conventional baseline model (its
      ``gbdt``: TF-IDF + logistic regression for text), named ``<metric>_vs_baseline_model``;
    * with a champion: each of ``task.champion_metrics`` trails the champion's by at most
      ``gates.max_regression`` (a factor of the champion's value for a ``relative`` metric);
    * a classifier's candidate predicts at least two classes on the test split, unless
      ``gates.allow_single_class``.
    """
    checks = [_check(name, candidate[name], bound, task.metric(name).op) for name, bound in gates.thresholds.items()]
    if "predicted_classes" in candidate and candidate.get("n", 0) > 0 and not gates.allow_single_class:
        checks.append(_check("predicted_classes", candidate["predicted_classes"], 2, ">=",
                             "it predicts one class for every row: whatever its scores, it tells no class apart; "
                             "try training.class_weight: balanced, or gates.allow_single_class: true to accept it"))
    if task.primary is not None:
        m = task.metric(task.primary)
        sign = 1 if m.higher_is_better else -1
        for what, ref, amount in (("baseline", baseline, gates.baseline_margin),
                                  ("gbdt", gbdt, None if gates.max_gap_to_gbdt is None else -gates.max_gap_to_gbdt),
                                  ("baseline_model", gbdt,
                                   None if gates.max_gap_to_baseline is None else -gates.max_gap_to_baseline)):
            if amount is not None and ref is not None:
                checks.append(_check(f"{m.name}_vs_{what}", candidate[m.name], ref[m.name] + sign * amount, m.op))
    for name in task.champion_metrics if champion is not None else ():
        m = task.metric(name)
        delta = gates.max_regression * abs(champion[name]) if m.relative else gates.max_regression
        bound = champion[name] - delta if m.higher_is_better else champion[name] + delta
        checks.append(_check(f"{name}_vs_champion", candidate[name], bound, m.op))
    return GateDecision(all(c.passed for c in checks), tuple(checks), champion_version)


def beats(task, candidate: dict, champion: dict | None, min_improvement: float = 0.0) -> tuple[bool, str]:
    """Promotion rule: does ``candidate`` deserve ``@champion`` over ``champion`` (same split)?

    ``task.champion_metrics`` are compared in order, each in its direction: the first that differs
    by more than ``min_improvement`` (a factor of the champion's value for a ``relative`` metric)
    decides. A tie keeps the champion: an identical retrain is not an improvement.
    """
    if champion is None:
        return True, "there is no champion"
    shown = lambda d: " / ".join(f"{d[n]:.4f}" for n in task.champion_metrics)  # noqa: E731
    names = " / ".join(task.champion_metrics)
    for name in task.champion_metrics:
        m, c, p = task.metric(name), candidate[name], champion[name]
        if abs(c - p) > (min_improvement * abs(p) if m.relative else min_improvement):
            ok = (c > p) == m.higher_is_better
            verb = "beats" if ok else "does not beat"
            return ok, f"{names} {shown(candidate)} {verb} the champion's {shown(champion)}"
    return False, (f"{names} {shown(candidate)} ties the champion's {shown(champion)} (no difference above "
                   f"gates.min_improvement {min_improvement:g}): the champion stays")
