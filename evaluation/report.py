"""Markdown reports for Prefect artifacts and MLflow."""

from __future__ import annotations

from evaluation.gates import GateDecision


def gate_markdown(task, decision: GateDecision, candidate: dict, champion: dict | None,
                  baseline: dict | None = None, gbdt: dict | None = None) -> str:
    """The gate's decision: every check with its value and bound, the figures it compared, and a
    classifier's per-class recall."""
    head = "PASSED" if decision.passed else f"REJECTED ({len(decision.failures)} reason(s))"
    lines = [f"# Gate: {head}", ""]

    def figures(d: dict, names) -> str:
        return ", ".join(f"{n} {d[n]:.4f}" for n in names if isinstance(d.get(n), (int, float)))

    lines += [f"Candidate ({task.name}): {figures(candidate, [m.name for m in task.metrics])}", ""]
    if champion is None:
        lines += ["No champion yet: no regression check.", ""]
    else:
        lines += [f"Champion v{decision.champion_version}: {figures(champion, task.champion_metrics)}", ""]
    if baseline:
        lines += [f"Trivial baseline ({baseline.get('predictor')}): {figures(baseline, [task.primary])}", ""]
    if gbdt:  # the primary metric's gap in its direction: positive, the candidate is better
        m = task.metric(task.primary)
        gap = (candidate[m.name] - gbdt[m.name]) * (1 if m.higher_is_better else -1)
        lines += [f"Gradient-boosted trees ({gbdt.get('predictor')}): {m.name} {gbdt[m.name]:.4f}, the candidate "
                  f"{candidate[m.name]:.4f} ({'+' if gap >= 0 else ''}{gap:.4f} {'better' if gap >= 0 else 'worse'}); "
                  f"trees fitted in {gbdt['fit_s']:.1f} s on 1 thread", ""]
    lines += ["| check | value | threshold | result |", "|---|---|---|---|"]
    for c in decision.checks:
        lines.append(f"| {c.name} | {c.value:.4f} | {c.op} {c.threshold:.4f} | {'pass' if c.passed else '**FAIL**'} |")
    if candidate.get("class_recall"):
        lines += ["", "## Per-class recall (candidate)", "", "| class | recall |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in candidate["class_recall"].items()]
    return "\n".join(lines) + "\n"

