"""The run summary: what one pipeline run did, built from its stages' results.

``to_dict`` is what ``summary.json``, the CLI's table and a failing run's ``exc.summary`` hold: a
section appears once its stage has run (``"training" not in s``: stopped before training).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from core.errors import DataValidationError, GateRejectedError, PreemptedError

# A failed run's status, by its exception.
ENDINGS = ((DataValidationError, "validation_failed"), (GateRejectedError, "rejected"), (PreemptedError, "preempted"))
# The training result's fields the summary carries.
TRAINING_KEYS = ("world_size", "backend", "strategy", "restarts", "samples_per_s", "global_batch", "effective_lr",
                 "weights_sha256", "wall_s", "resumed_from_step", "checkpoint_stall_frac")
# Keys present from the start, also while empty.
ALWAYS = ("status", "tracking_uri", "mlflow_run_id", "prefect_flow_run_id", "model_name", "model_version",
          "aliases", "metrics", "gates", "manifest", "timings")


def stage_tag(status: str, stage: str) -> str:
    """The ``trainflow.stage`` tag a run ends with: ``done``, ``rejected``, ``validation_failed``, else
    ``<status>: <stage>`` (``failed: train``, ``preempted: train``)."""
    final = {"registered": "done", "rejected": "rejected", "validation_failed": "validation_failed"}
    return final.get(status, f"{status}: {stage}")


def scores_of(task, scores: dict | None) -> dict[str, float]:
    """``scores``' figures for the task's metrics (one a scorer did not give is left out)."""
    return {m.name: scores[m.name] for m in task.metrics if isinstance((scores or {}).get(m.name), (int, float))}


@dataclass
class RunSummary:
    """One pipeline run; each stage's result fills its section (``task``: a ``tasks.base.Task``)."""

    tracking_uri: str
    mlflow_run_id: str
    prefect_flow_run_id: str | None
    model_name: str
    manifest: dict
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "running"
    model_version: str | None = None
    aliases: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    gates: list[dict] = field(default_factory=list)
    validation: dict | None = None
    plots: dict | None = None
    training: dict | None = None
    candidate_scored_in: str | None = None  # "worker" | "pipeline"
    champion: dict | None = None
    threshold: dict | None = None
    baseline: dict | None = None
    gbdt: dict | None = None
    promotion: dict | None = None
    train_dir: str | None = None
    exit_code: int | None = None
    error: str | None = None

    def validated(self, report: dict, data_docs: str | None) -> None:
        self.validation = {"success": True, "n_expectations": report["n_expectations"], "cached": report["cached"],
                           "data_docs": data_docs, "warnings": report.get("warnings", []),
                           "report": report.get("report_md")}

    def trained(self, result: dict, goodput: dict, curves_png: str | None) -> None:
        """``goodput``: the ledger's headline (``training.goodput.headline``)."""
        self.plots = {"training_curves": curves_png}
        self.training = {**{k: result[k] for k in TRAINING_KEYS}, "goodput": goodput,
                         "checkpoint_interval": result.get("checkpoint_interval") or {},
                         **{k: result.get(k) for k in ("resized_from", "batch_policy", "kept_epoch", "launcher")}}

    def evaluated(self, task, ev: dict, train_wall_s: float) -> None:
        """The evaluation report's scores: the candidate's, the champion's and the references'."""
        cand, champ, g = ev["candidate"], ev["champion"], ev.get("gbdt")
        if (ev.get("files") or {}).get("confusion_matrix"):
            self.plots = {**(self.plots or {}), "confusion_matrix": ev["files"]["confusion_matrix"]}
        self.metrics = {m.name: cand[m.name] for m in task.metrics}
        self.candidate_scored_in = ev.get("candidate_scored_in")
        self.champion = {"version": ev["champion_version"], "scores": ev.get("champion_scores"),
                         **({k: champ[k] for k in task.champion_metrics} if champ else {}), **scores_of(task, champ)}
        if cand.get("threshold") is not None:
            self.threshold = {"value": cand["threshold"], "tuned_for": task.threshold_metric()}
        if ev.get("baseline") and task.primary:
            self.baseline = {"predictor": ev["baseline"]["predictor"], "primary": task.primary,
                             **scores_of(task, ev["baseline"])}
        if g:
            self.gbdt = {"predictor": g["predictor"], "names": list(task.gbdt_names), "fit_s": g["fit_s"],
                         "candidate_train_s": train_wall_s,
                         "primary": task.primary, "higher_is_better": task.metric(task.primary).higher_is_better,
                         **{m.name: g[m.name] for m in task.metrics if m.name in g}}

    def registered(self, reg: dict, train_dir: str) -> None:
        self.status, self.exit_code, self.train_dir = "registered", 0, train_dir
        self.model_version, self.aliases, self.promotion = reg["version"], reg["aliases"], reg["promotion"]

    def failed(self, exc: BaseException) -> None:
        """The ending ``exc`` means, with what it carries: every failed expectation or gate."""
        self.status = next((status for kind, status in ENDINGS if isinstance(exc, kind)), "failed")
        if isinstance(exc, DataValidationError):
            self.validation = {"success": False, "report": exc.report.get("report_md"),
                               **{k: exc.report.get(k, []) for k in ("failures", "warnings", "skipped")}}
        if isinstance(exc, GateRejectedError):
            self.gates = exc.decision.get("checks", [])
        self.error, self.exit_code = str(exc), getattr(exc, "exit_code", 1)

    def to_dict(self) -> dict:
        """The summary's JSON form (shallow: ``timings`` is the run's own dict, completed at its end)."""
        kept = (*ALWAYS, *(("promotion",) if self.status == "registered" else ()))
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None or f.name in kept}
