"""Markdown reports for Prefect artifacts and MLflow."""

from __future__ import annotations

from evaluation.gates import GateDecision


def gate_markdown(task, decision: GateDecision, candidate: dict, champion: dict | None,
                  baseline: dict | None = None, gbdt: dict | None = None,
                  class_names: list[str] | None = None) -> str:
    """The gate's decision: every check with its value and bound, the figures it compared, and a
    classifier's per-class recall (by ``class_names``, the label's values, where given)."""
    head = "PASSED" if decision.passed else f"REJECTED ({len(decision.failures)} reason(s))"
    lines = [f"# Gate: {head}", ""]

    def figures(d: dict, names) -> str:
        return ", ".join(f"{n} {d[n]:.4f}" for n in names if isinstance(d.get(n), (int, float)))

    every = [m.name for m in task.metrics]
    lines += [f"Judged by {task.primary} ({'higher' if task.metric(task.primary).higher_is_better else 'lower'} "
              "is better).", ""] if task.primary else []
    lines += [f"Candidate ({task.name}): {figures(candidate, every)}", ""]
    if candidate.get("threshold") is not None:
        shown = class_names[1] if class_names and len(class_names) == 2 else "1"
        lines += [f"Decision threshold: class {shown!s} where its probability is >= {candidate['threshold']:.4f} "
                  f"(tuned on the held-out train rows for {task.threshold_metric()}); the registered model "
                  "predicts by it.", ""]
    if champion is None:
        lines += ["No champion yet: no regression check.", ""]
    else:
        lines += [f"Champion v{decision.champion_version}: {figures(champion, task.champion_metrics)}", ""]
    if baseline:
        lines += [f"Trivial baseline ({baseline.get('predictor')}): {figures(baseline, every)}", ""]
    if gbdt:  # the primary metric's gap in its direction: positive, the candidate is better
        m = task.metric(task.primary)
        gap = (candidate[m.name] - gbdt[m.name]) * (1 if m.higher_is_better else -1)
        model = task.gbdt_names[1]
        lines += [f"{model[0].upper()}{model[1:]} ({gbdt.get('predictor')}): {m.name} {gbdt[m.name]:.4f}, the "
                  f"candidate {candidate[m.name]:.4f} ({'+' if gap >= 0 else ''}{gap:.4f} "
                  f"{'better' if gap >= 0 else 'worse'}); fitted in {gbdt['fit_s']:.1f} s on 1 thread; {model}: "
                  f"{figures(gbdt, every)}", ""]
    lines += ["| check | value | threshold | result |", "|---|---|---|---|"]
    for c in decision.checks:
        lines.append(f"| {c.name} | {c.value:.4f} | {c.op} {c.threshold:.4f} | {'pass' if c.passed else '**FAIL**'} |")
    if candidate.get("class_recall"):
        lines += ["", "## Per-class recall (candidate)", "", "| class | recall |", "|---|---|"]
        named = class_names if class_names and len(class_names) == len(candidate["class_recall"]) else None
        lines += [f"| {named[i] if named else k} | {v:.4f} |"
                  for i, (k, v) in enumerate(candidate["class_recall"].items())]
    return "\n".join(lines) + "\n"

