"""The gate: absolute thresholds plus "no worse than the champion by more than delta".

``decide`` returns every check with its measured value and threshold, never just
"failed", so a rejected candidate carries all of its reasons.
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

    def reason(self) -> str:
        return f"{self.name} = {self.value:.4f}, needs {self.op} {self.threshold:.4f}"


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
        return {
            "passed": self.passed,
            "champion_version": self.champion_version,
            "checks": [asdict(c) for c in self.checks],
            "reasons": self.reasons(),
        }


def _check(name: str, value: float, threshold: float, op: str) -> Check:
    ok = value >= threshold if op == ">=" else value <= threshold
    return Check(name, float(value), float(threshold), op, bool(ok))


def decide(candidate: dict, gates: GatesConfig, champion: dict | None = None,
           champion_version: str | None = None) -> GateDecision:
    """Apply every gate to ``candidate`` metrics (and the champion's, when there is one).

    Language-model metrics (``candidate["kind"] == "lm"``) go to :func:`decide_lm`.
    """
    if candidate.get("kind") == "lm":
        return decide_lm(candidate, gates, champion, champion_version)
    checks = [
        _check("accuracy", candidate["accuracy"], gates.min_accuracy, ">="),
        _check("macro_f1", candidate["macro_f1"], gates.min_macro_f1, ">="),
        _check("min_class_recall", candidate["min_class_recall"], gates.min_class_recall, ">="),
        _check("latency_p95_ms", candidate["latency_p95_ms"], gates.max_latency_p95_ms, "<="),
    ]
    if champion is not None:
        for key in ("accuracy", "macro_f1"):
            checks.append(_check(f"{key}_vs_champion", candidate[key], champion[key] - gates.max_regression, ">="))
    return GateDecision(all(c.passed for c in checks), tuple(checks), champion_version)


def decide_lm(candidate: dict, gates: GatesConfig, champion: dict | None = None,
              champion_version: str | None = None) -> GateDecision:
    """Perplexity at most ``max_perplexity``, latency bound, and no worse than the champion's
    perplexity by more than the factor ``1 + max_perplexity_regression`` (0 when unset)."""
    if gates.max_perplexity is None:
        raise ValueError("gates.max_perplexity: required to gate a language model")
    checks = [
        _check("perplexity", candidate["perplexity"], gates.max_perplexity, "<="),
        _check("latency_p95_ms", candidate["latency_p95_ms"], gates.max_latency_p95_ms, "<="),
    ]
    if champion is not None:
        allowed = champion["perplexity"] * (1 + (gates.max_perplexity_regression or 0.0))
        checks.append(_check("perplexity_vs_champion", candidate["perplexity"], allowed, "<="))
    return GateDecision(all(c.passed for c in checks), tuple(checks), champion_version)
