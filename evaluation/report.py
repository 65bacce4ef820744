"""Markdown reports for Prefect artifacts and MLflow."""

from __future__ import annotations

from evaluation.gates import GateDecision


def gate_markdown(decision: GateDecision, candidate: dict, champion: dict | None) -> str:
    head = "PASSED" if decision.passed else f"REJECTED ({len(decision.failures)} reason(s))"
    lines = [f"# Gate: {head}", ""]
    if candidate.get("kind") == "lm":
        return _lm_markdown(decision, candidate, champion, lines)
    if champion is None:
        lines += ["No champion yet: absolute thresholds only.", ""]
    else:
        lines += [f"Champion v{decision.champion_version}: accuracy {champion['accuracy']:.4f}, "
                  f"macro-F1 {champion['macro_f1']:.4f}", ""]
    lines += ["| check | value | threshold | result |", "|---|---|---|---|"]
    for c in decision.checks:
        lines.append(f"| {c.name} | {c.value:.4f} | {c.op} {c.threshold:.4f} | {'pass' if c.passed else '**FAIL**'} |")
    lines += ["", "## Per-class recall (candidate)", "", "| class | recall |", "|---|---|"]
    lines += [f"| {k} | {v:.4f} |" for k, v in candidate["class_recall"].items()]
    return "\n".join(lines) + "\n"


def _lm_markdown(decision: GateDecision, candidate: dict, champion: dict | None, lines: list[str]) -> str:
    if champion is None:
        lines += ["No champion yet: absolute thresholds only.", ""]
    else:
        lines += [f"Champion v{decision.champion_version}: perplexity {champion['perplexity']:.4f}, "
                  f"bits/byte {champion['bits_per_byte']:.4f}", ""]
    lines += [f"Candidate on {candidate['n_docs']} eval documents ({candidate['n_tokens']} target bytes): "
              f"loss {candidate['loss']:.4f} nats, perplexity {candidate['perplexity']:.4f}, "
              f"bits/byte {candidate['bits_per_byte']:.4f}", ""]
    lines += ["| check | value | threshold | result |", "|---|---|---|---|"]
    for c in decision.checks:
        lines.append(f"| {c.name} | {c.value:.4f} | {c.op} {c.threshold:.4f} | {'pass' if c.passed else '**FAIL**'} |")
    return "\n".join(lines) + "\n"
