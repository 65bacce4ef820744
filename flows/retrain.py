"""The retrain flow: run the pipeline only when the champion is stale.

Data md5, config id and code (files changed since the champion's git sha, but data, configs, docs and
tests) all equal the ``@champion``'s tags: **up-to-date**, nothing runs. Changed data is checked for drift
against the champion's training split (``retrain`` config section): ``retrain.policy: any_change`` trains
on any new data version, ``drift`` only on drifted data (otherwise **no-drift**). A changed config or
code, no champion, or ``force``: trains.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from core.errors import DataUnavailableError
from core.manifest import manifest_diff
from core.paths import tracking_uri, under_home
from flows.params import PipelineParams, RetrainParams, RunInputs, run_inputs
from flows.pipeline import TASK, load_inputs, pipeline


def model_folder_change(tags: dict, manifest) -> str | None:
    """Why the champion is stale for its pretrained model folder (the folder changed, or one was added or
    removed), or None: the champion's ``pretrained_md5`` tag against the manifest's folder."""
    then = tags.get("pretrained_md5")
    now = manifest.pretrained.md5 if manifest.pretrained is not None else None
    if then == now:
        return None
    return f"pretrained model folder changed: {then or 'none'} -> {now or 'none'}"

def _champion_dataset(run_id: str | None, fallback):
    """The dataset section the champion was trained with (its run's config.json), else ``fallback``."""
    from core.config import DatasetConfig
    from registry import store

    if not run_id:
        return fallback
    # IntegrityError: changed since it was logged; a champion logged before hashes were recorded gives
    # None: this config's dataset section, not an unchecked file.
    dumped = store.load_recorded(run_id, "config.json", unrecorded_ok=True)
    try:
        return DatasetConfig.model_validate(dumped["dataset"])
    except Exception:  # noqa: BLE001 - an old or odd run: the current layout is the best guess
        return fallback


def _drift_check(cfg, root: Path, champ: dict) -> dict:
    """Drift of the workspace's training split against the champion's (by its data md5): the task
    gives both as frames of its features (``Task.drift_frames``), read from DVC by ``read``."""
    from core.versions import read_tracked_file
    from tasks import get_task
    from validation.drift import drift_report

    tags = champ["tags"]
    ds = _champion_dataset(champ.get("run_id"), cfg.dataset)
    out_root = Path(ds.dvc_file).parent / tags.get("data_dvc_path", "")

    def read(path: Path) -> bytes:
        """A file of the champion's data version, by its path in the repository."""
        try:
            relpath = Path(path).relative_to(out_root).as_posix()
        except ValueError:
            raise DataUnavailableError(f"the champion's training split {path} is not inside its DVC "
                                       f"output {out_root}") from None
        return read_tracked_file(root, tags["data_md5"], relpath, rev=tags.get("data_rev"),
                                 dvc_file=ds.dvc_file, path_in_repo=Path(path).as_posix())

    reference, current, features = get_task(cfg.task).drift_frames(cfg, root, ds, read)
    return drift_report(reference, current, features, cfg.retrain)


@task(name="decide", timeout_seconds=300, **TASK)
def decide(inputs: RunInputs, force: bool) -> dict:
    """Should this run train? Returns the decision with every reason (see the module docstring)."""
    from core.versions import code_changes
    from registry import models, store
    from validation.drift import drift_markdown

    log = get_run_logger()
    plan, root, home, manifest = load_inputs(inputs)
    cfg = plan.cfg
    store.configure(tracking_uri(home), cfg.registry.experiment, under_home(home, "mlartifacts"))
    champ = models.champion_version(cfg.registry.model_name)
    current = {"data_md5": manifest.data.md5, "config_sha256": manifest.config_sha256,
               "git_sha": manifest.git_sha, "git_dirty": manifest.git_dirty}
    reasons = ["forced"] if force else []
    skip_reason = champion = drift = drift_error = None
    changes: list[str] | None = []
    if champ is None:
        reasons.append(f"{cfg.registry.model_name} has no @champion yet")
    else:
        champion = {"version": champ["version"], **{k: champ["tags"].get(k) for k in ("data_md5", "config_sha256",
                                                                                    "git_sha")}}
        diff = manifest_diff(champ["tags"], current, ("config_sha256", "data_md5"))
        if "config_sha256" in diff:
            reasons.append(f"config changed: {str(champion['config_sha256'])[:12]} -> {current['config_sha256'][:12]}")
        if (folder := model_folder_change(champ["tags"], manifest)) is not None:
            reasons.append(folder)
        changes = code_changes(root, champion["git_sha"])
        if changes is None:
            reasons.append(f"code unknown: the champion's commit {str(champion['git_sha'])[:12]} is not in {root}")
        elif changes:
            more = f" and {len(changes) - 5} more" if len(changes) > 5 else ""
            reasons.append(f"code changed since {champion['git_sha'][:12]}: {', '.join(changes[:5])}{more}")
        if "data_md5" in diff:
            change = " -> ".join(map(str, diff["data_md5"]))
            try:
                drift = _drift_check(cfg, root, champ)
            except (DataUnavailableError, ValueError) as exc:
                drift_error = str(exc)
                log.warning("drift check could not run: %s", exc)
            if drift is not None:
                create_markdown_artifact(markdown=drift_markdown(drift), key="drift-report",
                                         description=f"Drift of data {current['data_md5']} vs the champion's")
                counted = f"{drift['n_drifted']} of {drift['n_features']} features"
            if cfg.retrain.policy == "any_change":
                verdict = (f"drifted: {counted}" if drift and drift["drifted"] else "no drift" if drift
                           else "drift unknown")
                reasons.append(f"data changed: {change} ({verdict})")
            elif drift is None:
                reasons.append(f"data changed: {change}, and the drift check could not run ({drift_error})")
            elif drift["drifted"]:
                reasons.append(f"data drifted: {change}, {counted}")
            else:
                skip_reason = f"data changed ({change}) but did not drift ({counted}; retrain.policy: drift)"
    train = bool(reasons)
    status = "train" if train else ("no-drift" if skip_reason else "up-to-date")
    if not train and skip_reason is None:
        skip_reason = (f"data {current['data_md5']}, config {current['config_sha256'][:12]} and code equal "
                       f"the champion's (v{champion['version']})")
    decision = {"train": train, "status": status, "reasons": reasons, "skip_reason": skip_reason,
                "forced": force, "policy": cfg.retrain.policy, "model_name": cfg.registry.model_name,
                "champion": champion, "current": current, "code_changes": changes, "drift": drift,
                "drift_error": drift_error, "home": str(home), "tracking_uri": tracking_uri(home)}
    create_markdown_artifact(markdown=decision_markdown(decision), key="retrain-decision",
                             description="Why the retrain flow trains or not")
    return decision


def decision_markdown(d: dict) -> str:
    lines = [f"# Retrain: {d['status']}", ""]
    lines += [f"- {r}" for r in d["reasons"]] or [f"- {d['skip_reason']}"]
    if d["champion"]:
        c = d["champion"]
        lines += ["", "| | champion v" + c["version"] + " | now |", "|---|---|---|",
                  f"| data md5 | {c['data_md5']} | {d['current']['data_md5']} |",
                  f"| config id | {str(c['config_sha256'])[:12]} | {d['current']['config_sha256'][:12]} |",
                  f"| git sha | {str(c['git_sha'])[:12]} | {d['current']['git_sha'][:12]}"
                  + (" (dirty)" if d["current"]["git_dirty"] else "") + " |"]
    if d["drift"]:
        lines += ["", f"Drift: {d['drift']['n_drifted']} of {d['drift']['n_features']} features "
                      f"({'drifted' if d['drift']['drifted'] else 'no drift'}); table in the drift-report artifact."]
    return "\n".join(lines) + "\n"


def _log_decision(run_id: str | None, d: dict) -> None:
    """Attach the decision (and the drift report) to the pipeline's MLflow run."""
    if not run_id:
        return
    from registry import store
    from validation.drift import drift_markdown

    store.log_json(run_id, {k: v for k, v in d.items() if k != "drift"}, "retrain/decision.json")
    if d["drift"]:
        store.log_json(run_id, d["drift"], "retrain/drift.json")
        store.client().log_text(run_id, drift_markdown(d["drift"]), "retrain/drift.md")
        store.log_metrics(run_id, {"drift/n_drifted": d["drift"]["n_drifted"],
                                   "drift/drifted_fraction": d["drift"]["drifted_fraction"]})
    store.set_tags(run_id, {"retrain.reasons": "; ".join(d["reasons"])})


def _run_name() -> str:
    from prefect.runtime import flow_run

    try:
        p = flow_run.parameters.get("params") or {}
        p = p if isinstance(p, RetrainParams) else RetrainParams.model_validate(p)
        return f"retrain-{run_inputs(p).config_path.stem}"
    except Exception:  # a name must never fail the run
        return "retrain"


@flow(name="retrain", flow_run_name=_run_name, log_prints=True)
def retrain(params: RetrainParams = RetrainParams()) -> dict:
    """Run the pipeline when data, config or code moved past the champion (or ``force``). Returns a
    ``{"status": "up-to-date" | "no-drift", "exit_code": 0, ...}`` summary when it skips, else the
    pipeline's; either (and a failing pipeline's ``.summary``) carries the decision as ``retrain``."""
    t0 = time.perf_counter()
    d = decide(run_inputs(params), params.force)
    log = get_run_logger()
    if not d["train"]:
        log.info("retrain: %s: %s", d["status"], d["skip_reason"])
        return {"status": d["status"], "exit_code": 0, "model_name": d["model_name"], "model_version": None,
                "aliases": [], "tracking_uri": d["tracking_uri"],
                "champion": {"version": d["champion"]["version"]} if d["champion"] else None,
                "retrain": d, "timings": {"flow": round(time.perf_counter() - t0, 3)}}
    log.info("retrain: training because %s", "; ".join(d["reasons"]))
    try:
        summary = pipeline(PipelineParams.model_validate(params.model_dump(exclude={"force"})))
    except BaseException as exc:
        if (partial := getattr(exc, "summary", None)) is not None:
            partial["retrain"] = d
            _log_decision(partial.get("mlflow_run_id"), d)
        raise
    summary["retrain"] = d
    _log_decision(summary.get("mlflow_run_id"), d)
    out = under_home(Path(d["home"]), "runs", summary["mlflow_run_id"], "retrain.json")
    out.write_text(json.dumps(d, indent=2, default=str))
    return summary
