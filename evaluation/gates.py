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


def beats(candidate: dict, champion: dict | None) -> tuple[bool, str]:
    """Promotion rule: does ``candidate`` deserve ``@champion`` over ``champion``?

    Both sets of metrics must come from the same test split. Higher accuracy wins; equal
    accuracy goes to the higher (or equal) macro-F1, so a retrained model that is exactly as
    good replaces the older one. Stricter than the gate, which lets a candidate trail the
    champion by ``max_regression`` and still be registered (as ``@challenger``).
    """
    if champion is None:
        return True, "there is no champion"
    ca, cf, pa, pf = candidate["accuracy"], candidate["macro_f1"], champion["accuracy"], champion["macro_f1"]
    ok = ca > pa or (ca == pa and cf >= pf)
    word = "beats" if ok else "does not beat"
    return ok, f"accuracy {ca:.4f} / macro-F1 {cf:.4f} {word} the champion's {pa:.4f} / {pf:.4f}"


def beats_lm(candidate: dict, champion: dict | None) -> tuple[bool, str]:
    """Promotion rule for a language model: lower (or equal) eval perplexity wins, so an equally
    good retrained model replaces the older one. Both from the same eval documents."""
    if champion is None:
        return True, "there is no champion"
    c, p = candidate["perplexity"], champion["perplexity"]
    ok = c <= p
    return ok, f"perplexity {c:.4f} {'beats' if ok else 'does not beat'} the champion's {p:.4f}"
