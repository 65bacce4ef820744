"""The pipeline flow: resolve -> validate -> [measure] -> train -> evaluate -> gate -> register.

Each task calls one function of a room below; everything logs into ONE MLflow
run, and each stage leaves a Prefect markdown artifact. Input errors
(``TrainflowError``) are never retried; transient ones (a locked database) are.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_image_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import MissingContextError

from core.config import PipelineConfig, load_config
from core.env import apply_offline_env
from core.errors import DataValidationError, GateRejectedError, TrainflowError
from core.manifest import Manifest, build_manifest, image_from_env
from core.paths import importable_root, project_root, tracking_uri, trainflow_home, under_home
from core.summary import RunSummary, scores_of, stage_tag
from core.workspace import check_tracked
from flows.params import PipelineParams, RunInputs, run_inputs
from flows.promotion import promotion_lock
from tasks.base import Task
from training.plan import LaunchPlan


def _transient(task_, task_run, state) -> bool:
    """Retry only failures that are not the user's input: bad data, config or gates are final."""
    return not isinstance(state.data, TrainflowError)


TASK = dict(cache_policy=NO_CACHE, retry_condition_fn=_transient)


@dataclass
class RunContext:
    """What every stage needs; built once by ``resolve``."""

    cfg: PipelineConfig
    task: Task  # everything that differs between kinds of problem, judged by the config's metric
    root: Path
    home: Path
    tracking_uri: str
    run_id: str
    manifest: Manifest
    out_dir: Path
    plan: LaunchPlan  # the launch plan: world, strategy, threads, and why
    launcher: str = "local"  # where the plan runs (training.launchers): local, slurm, kubernetes


class _InputErrorsWithoutTraceback(logging.Filter):
    """Drops the traceback Prefect logs with an input error (``TrainflowError``: bad data, config or a
    rejected candidate): not a bug, its one line says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, TrainflowError):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_input_errors() -> None:
    """Install :class:`_InputErrorsWithoutTraceback` on Prefect's run loggers (once per process)."""
    for name in ("prefect.task_runs", "prefect.flow_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _InputErrorsWithoutTraceback) for f in logger.filters):
            logger.addFilter(_InputErrorsWithoutTraceback())


def load_inputs(inputs: RunInputs) -> tuple[LaunchPlan, Path, Path, Manifest]:
    """``(launch plan, project root, TRAINFLOW_HOME, manifest)`` as ``resolve`` records them; the
    plan's config has no "auto" left (the retrain flow compares them with the champion's)."""
    from tasks import task_for
    from training.plan import host_facts, plan_launch

    cfg_path = inputs.config_path
    root = project_root(cfg_path if cfg_path.is_absolute() else Path.cwd() / cfg_path)
    importable_root(root)  # a model.factory module in the repository root imports, also in a Prefect worker
    home = trainflow_home(root)
    cache = under_home(home, "cache")
    apply_offline_env(home)  # before mlflow is imported: telemetry is decided at import
    cfg = load_config(cfg_path if cfg_path.is_absolute() or cfg_path.exists() else root / cfg_path,
                      list(inputs.overrides))
    task_for(cfg)  # the config fits its task, or a ConfigError names the key
    facts = host_facts(cfg, home)
    plan = plan_launch(cfg, facts, inputs.nproc_per_node, inputs.nnodes or 1)
    image = image_from_env(inputs.image, inputs.image_digest)
    model_dvc = cfg.pretrained.dvc_file if cfg.pretrained is not None else None
    manifest = build_manifest(root, cfg.name, plan.cfg.config_id(), cfg.dataset.dvc_file, cfg.seed, plan.world,
                              image, cache, model_dvc)
    # The md5s just recorded are the data (and model folder) that will train.
    check_tracked(root, [cfg.dataset.dvc_file, *filter(None, [model_dvc])])
    return plan, root, home, manifest


@task(name="resolve", timeout_seconds=120, retries=1, retry_delay_seconds=1, **TASK)
def resolve(inputs: RunInputs) -> RunContext:
    """Load the config, plan the launch, record the manifest, open the pipeline's MLflow run with the
    data's splits as its datasets (digest: the DVC md5). A plan still to be measured is recorded by
    ``measure``, after validation."""
    from registry import store
    from tasks import get_task
    from training.slots import unclaimed_resumable

    plan, root, home, manifest = load_inputs(inputs)
    cfg = plan.cfg
    uri = tracking_uri(home)
    exp_id = store.configure(uri, cfg.registry.experiment, under_home(home, "mlartifacts"))
    from registry.orphans import mark_orphans_killed, owner_tags

    tags = {**manifest.tags(), store.STAGE_TAG: "resolve", **owner_tags()}
    # A preempted training of these inputs is resumed by `train`: its run goes on in this one.
    folders = [] if plan.unmeasured else unclaimed_resumable(home, cfg.name, cfg.config_id(), manifest.inputs_md5,
                                                             plan.nproc_per_node)
    run_id = (store.reopen_run(folders, cfg.config_id(), exp_id, tags, get_run_logger())
              or store.start_run(exp_id, f"{cfg.name}-{manifest.data.md5[:8]}", tags))
    mark_orphans_killed(exp_id, run_id)  # runs whose process died before ending them
    task_ = get_task(cfg.task).with_primary(cfg.primary_metric)  # judged by the config's metric
    store.log_datasets(run_id, task_.data_splits(cfg), manifest.data.md5, manifest.data.rev)
    out = under_home(home, "runs", run_id)
    out.mkdir(parents=True, exist_ok=True)
    get_run_logger().info("config %s (%s), data %s, mlflow run %s", cfg.name, cfg.config_id()[:12],
                          manifest.data.md5, run_id)
    ctx = RunContext(cfg, task_, root, home, uri, run_id, manifest, out, plan, inputs.launcher or "local")
    if not plan.unmeasured:
        _record(ctx)
    return ctx


def _record(ctx: RunContext) -> None:
    """Log the run's plan, manifest, config and parameters (MLflow parameters are written once: only
    a final plan)."""
    from registry import store

    for reason in ctx.plan.reasons:
        get_run_logger().info("plan: %s", reason)
    store.set_tags(ctx.run_id, ctx.manifest.tags())
    store.log_recorded(ctx.run_id, ctx.manifest.to_dict(), "manifest.json")
    store.log_recorded(ctx.run_id, ctx.cfg.model_dump(mode="json"), "config.json")
    store.log_params(ctx.run_id, ctx.cfg.model_dump(mode="json"))
    (ctx.out_dir / "manifest.json").write_text(json.dumps(ctx.manifest.to_dict(), indent=2))


@task(name="measure", **TASK)
def measure(ctx: RunContext) -> RunContext:
    """Probe this host's layouts (``training.probe``) and plan again with what was measured; record
    that plan. It trains, so it runs only after validation passed."""
    from training.probe import measured_plan

    plan = measured_plan(ctx.plan, ctx.root, ctx.manifest.data.md5, ctx.home, get_run_logger().info)
    manifest = replace(ctx.manifest, config_sha256=plan.cfg.config_id(), world=plan.world)
    ctx = replace(ctx, cfg=plan.cfg, plan=plan, manifest=manifest)
    _record(ctx)
    return ctx


@task(name="run-expectations", timeout_seconds=300, **TASK)
def run_expectations(plan, data_key: str, suite_key: str, report_dir: str, cache_file: str) -> dict:
    """Run the task's validation plan with GX, unless ``cache_file`` holds the result for the same data
    bytes and suite (JSON, ``validation.cache``: it cannot run code, and a mismatch is validated
    again). ``report["cached"]`` says which."""
    from validation import cache
    from validation.gx_run import run_plan

    report = cache.read(Path(cache_file), data_key, suite_key)
    if report is not None:
        return {**report, "cached": True}
    report = run_plan(plan, Path(report_dir))
    try:
        cache.write(Path(cache_file), data_key, suite_key, report)
    except (OSError, TypeError, ValueError) as exc:  # a result not kept is validated again next time
        _logger().warning("validation result not cached in %s: %s", cache_file, exc)
    return {**report, "cached": False}


@task(name="validate", timeout_seconds=360, **TASK)
def validate(ctx: RunContext) -> dict:
    """Run the task's validation plan (or reuse its cached result); raise DataValidationError
    (stops the flow) on any failed expectation."""
    import shutil

    from registry import store
    from validation.cache import cache_file
    from validation.gx_run import data_hash
    from validation.gx_run import suite_key as plan_suite_key
    from validation.report import summary_markdown

    plan = ctx.task.validation_plan(ctx.cfg, ctx.root)
    data_key, suite_key = data_hash(plan.files), plan_suite_key(plan)
    # Content-addressed, like the cached result beside it, so its files still describe this data.
    record = cache_file(under_home(ctx.home, "validation"), data_key, suite_key)
    cache_dir = record.with_suffix("")
    report = run_expectations(plan, data_key, suite_key, str(cache_dir), str(record))
    if report["cached"]:
        get_run_logger().info("validation: cached result for data %s and suite %s (GX not run again)",
                              data_key[:12], suite_key[:12])
    report_dir = ctx.out_dir / "validation"
    if cache_dir.is_dir():
        shutil.copytree(cache_dir, report_dir, dirs_exist_ok=True)
    else:  # the cached files were deleted: the report itself is enough
        report_dir.mkdir(parents=True, exist_ok=True)
        (report_dir / "summary.md").write_text(summary_markdown(report))
    store.log_file(ctx.run_id, report_dir, "validation")
    store.log_metrics(ctx.run_id, {"validation/n_failed": report["n_failed"],
                                   "validation/n_expectations": report["n_expectations"],
                                   "validation/cached": report["cached"]})
    create_markdown_artifact(markdown=summary_markdown(report), key="validation-report",
                             description="Great Expectations result")
    for w in report.get("warnings") or []:
        get_run_logger().warning("validation: %s", w.get("message") or w.get("detail"))
    report["report_md"] = str(report_dir / "summary.md")
    if not report["success"]:
        raise DataValidationError(validation_error(report), report)
    return report


def validation_error(report: dict) -> str:
    """One line for a failed validation: how many checks failed, the first of them in words, and
    where the report is (every failure is in it, and in the run summary's ``validation.failures``)."""
    failures = report.get("failures") or []
    first = failures[0].get("message") or failures[0].get("detail") if failures else None
    if first is None and report.get("skipped"):
        s = report["skipped"][0]
        first = f"{s.get('split')}: {s.get('check')} not run: {s.get('reason')}"
    more = len(failures) - 1
    return (f"data validation failed ({report.get('n_failed', len(failures))} check(s)): {first}"
            + (f"; and {more} more" if more > 0 else "") + f"; report: {report.get('report_md')}")


def _data_docs(ctx: RunContext) -> str | None:
    """The run folder's copy of the GX Data Docs (``validate`` copies them in), if they were built."""
    from validation.gx_run import DATA_DOCS_DIR

    index = ctx.out_dir / "validation" / DATA_DOCS_DIR / "index.html"
    return str(index) if index.is_file() else None


@dataclass
class TrainFolder:
    """The training folder a run holds (``flock``, ``training.slots``) from ``train`` to the flow's end."""

    folder: Path
    lock_fd: int | None

    @classmethod
    def claim(cls, ctx: RunContext) -> TrainFolder:
        """This run's training folder, held exclusively (``training.slots``)."""
        from training.slots import claim_train_dir

        return cls(*claim_train_dir(ctx.home, ctx.cfg.name, ctx.cfg.config_id(), ctx.manifest.inputs_md5,
                                    ctx.plan.nproc_per_node, _logger()))

    def __enter__(self) -> TrainFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Close this process's copy of the lock (the job started in the folder keeps its own)."""
        from core.locks import release

        fd, self.lock_fd = self.lock_fd, None
        release(fd)


def _train_timeout_s(ctx: RunContext) -> float:
    """The train task's limit: training's own, a minute to stop, and a cluster's queue time."""
    queued = {"slurm": ctx.cfg.launcher.slurm.queue_limit_s,
              "kubernetes": ctx.cfg.launcher.kubernetes.pending_timeout_s}.get(ctx.launcher, 0)
    return ctx.cfg.training.timeout_s + 60 + queued


def _logger():
    """The Prefect run logger inside a flow or task, else this module's (a caller outside Prefect)."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


@task(name="train", retries=0, **TASK)
def train(ctx: RunContext, slot: TrainFolder) -> dict:
    """torchrun the worker in ``slot`` (on this host or a cluster's, ``ctx.launcher``), relaying its
    metrics file into the pipeline's MLflow run and following its progress (``flows.progress``: the
    terminal and the Prefect artifact)."""
    from prefect.runtime import flow_run

    from core.metrics_file import METRICS_FILE
    from flows.progress import follow_progress
    from registry.orphans import cancel_orphaned_jobs
    from registry.relay import relay_metrics
    from training import slurm
    from training.launcher import SCORE_ENV
    from training.launchers import Labels, cancel_kube_job, launcher_for
    from training.sink import RUN_ID_ENV

    launcher = launcher_for(ctx.launcher)
    rest = ctx.cfg.launcher.slurm.rest
    for line in cancel_orphaned_jobs(ctx.home, {"slurm": lambda job: slurm.cancel(job, rest=rest),
                                                "kubernetes": cancel_kube_job}):
        _logger().warning("%s, left by a run on this home that was killed: cancelled", line)

    # Empty, not absent: an inherited run id must not switch rank 0's direct MLflow logging on (this
    # process relays its metrics file). Rank 0 scores the program where torch is loaded already.
    job_env = {RUN_ID_ENV: "", SCORE_ENV: "1"}

    # Entered before the job starts: the relay begins at this run's first record (or where a resumed
    # run of the same MLflow run stopped).
    with relay_metrics(ctx.run_id, slot.folder / METRICS_FILE, record=(slot.folder, ctx.cfg.config_id())), \
            follow_progress(slot.folder / METRICS_FILE, ctx.cfg.training.epochs, _logger(), ctx.cfg.name) as progress:
        job = launcher.start(ctx.plan, slot.folder, ctx.root, ctx.manifest.inputs_md5, job_env, lock_fd=slot.lock_fd,
                             labels=Labels(str(flow_run.id or ""), ctx.run_id), hooks=_job_hooks(ctx))
        # Back as soon as rank 0's result is final: torchrun's exit overlaps the evaluation.
        result = job.finish(at_result=True)
        progress.completed = result.get("status") == "completed"
        return result


def _job_hooks(ctx: RunContext):
    """A cluster job's state and logs to the task's log; its id recorded in the home (and the MLflow
    run) while it lives, so the next run cancels it if this one is killed (registry.orphans)."""
    from registry import store
    from registry.orphans import forget_job, record_job
    from training.launchers import Hooks

    logger, name = _logger(), ctx.launcher

    def submitted(job_id: str) -> None:
        record_job(ctx.home, name, job_id)
        try:  # the final tags follow in log-training, which retries
            store.set_tags(ctx.run_id, {f"trainflow.{name}.job_id": job_id})
        except Exception as exc:  # noqa: BLE001 - a tag must not fail a submitted job
            logger.warning("could not tag the MLflow run with job %s: %s", job_id, exc)

    return Hooks(log=logger.info, submitted=submitted, ended=lambda job_id: forget_job(ctx.home, name, job_id))


@task(name="log-training", timeout_seconds=120, retries=2, retry_delay_seconds=2, **TASK)
def log_training(ctx: RunContext, result: dict) -> str | None:
    """Log the job's result and curves PNG into the pipeline's MLflow run; returns the PNG's path or
    None. Its own retried task: a transient MLflow error must not fail ``train``, which never retries."""
    from registry import store
    from training.goodput import headline

    store.log_file(ctx.run_id, Path(result["out_dir"]) / "result.json", "training")
    if where := result.get("launcher"):  # a cluster's job: its id, nodes and final state
        store.set_tags(ctx.run_id, {f"trainflow.{where['name']}.{k}": ",".join(map(str, v)) if isinstance(v, list)
                                    else str(v) for k, v in where.items() if k != "name"})
    png = _training_curves(ctx, result)

    goodput = {("train/goodput" if k == "goodput" else f"goodput/{k}"): v
               for k, v in headline(result.get("goodput")).items() if v is not None}
    kept = {"train/kept_epoch": result["kept_epoch"]["epoch"]} if result.get("kept_epoch") else {}
    store.log_metrics(ctx.run_id, {"train/samples_per_s_mean": result["samples_per_s"],
                                   "train/wall_s": result["wall_s"], "train/restarts": result["restarts"], **goodput,
                                   **kept})
    create_markdown_artifact(markdown=_training_md(result), key="training-result",
                             description="torchrun training result")
    return png


def _training_curves(ctx: RunContext, result: dict) -> str | None:
    """Draw the per-epoch curves, log them (MLflow ``plots/``) and publish them as the Prefect image
    artifact ``training-curves`` (a data URL: shown offline). An undrawable history only warns."""
    import base64

    from evaluation.curves import curves_png
    from registry import store

    try:
        png = curves_png(result.get("history") or [], ctx.out_dir / "plots" / "training_curves.png",
                         f"{ctx.cfg.name}: training curves, {result['world_size']} worker(s)")
    except (ValueError, OSError, KeyError, TypeError) as exc:
        _logger().warning("training curves not drawn: %s", exc)
        return None
    store.log_file(ctx.run_id, png, "plots")
    create_image_artifact(image_url="data:image/png;base64," + base64.b64encode(png.read_bytes()).decode(),
                          key="training-curves", description=f"Loss and validation accuracy per epoch ({png})")
    return str(png)


@task(name="evaluate", timeout_seconds=300, retries=1, **TASK)
def evaluate(ctx: RunContext, result: dict) -> dict:
    """Score the candidate, the current champion and the task's trivial baseline on the same split.
    The champion's recorded scores are used when they were measured on the same split bytes by the
    same metric code (``evaluation.recorded``), else it is rescored; ``report["champion_scores"]``."""
    from evaluation.champion import recorded_or_loaded
    from evaluation.evaluate import evaluate as run_eval
    from registry import models, store

    champ = models.champion_version(ctx.cfg.registry.model_name)
    recorded, loaded = recorded_or_loaded(ctx.task, ctx.cfg, ctx.root, champ, lambda: _load_champion(ctx))
    report = run_eval(ctx.task, ctx.cfg, ctx.root, Path(result["out_dir"]), ctx.out_dir / "evaluation",
                      loaded, recorded)
    report["champion_version"] = champ["version"] if champ else None
    g = report.get("gbdt")
    # At step 0, where registration logs the model: MLflow links them to the LoggedModel's page.
    logged = {"test": report["candidate"], "champion": report["champion"], "gbdt": g,
              "baseline": report.get("baseline") if ctx.task.primary else None}
    store.log_metrics(ctx.run_id, {**({"gbdt/fit_s": g["fit_s"]} if g else {}), **{
        f"{k}/{name}": v for k, scores in logged.items() for name, v in scores_of(ctx.task, scores).items()}})
    if g or report.get("gbdt_skipped"):
        store.set_tags(ctx.run_id, {"trainflow.gbdt": g["predictor"] if g else report["gbdt_skipped"]})
    if report["champion_version"] is not None:
        store.set_tags(ctx.run_id, {"trainflow.champion_scores": report["champion_scores"]})
        _logger().info("champion v%s: %s", report["champion_version"],
                       "its recorded scores (same test split bytes and metric code)"
                       if report["champion_scores"] == "recorded" else "loaded and rescored on this test split")
    store.log_file(ctx.run_id, ctx.out_dir / "evaluation", "evaluation")
    return report


@task(name="gate", timeout_seconds=60, **TASK)
def gate(ctx: RunContext, report: dict) -> dict:
    """Decide; raise GateRejectedError with every reason when any check fails."""
    from evaluation.gates import decide
    from evaluation.report import gate_markdown
    from registry import store

    decision = decide(ctx.task, report["candidate"], ctx.cfg.gates, report["champion"], report["champion_version"],
                      report.get("baseline"), report.get("gbdt"))
    md = gate_markdown(ctx.task, decision, report["candidate"], report["champion"], report.get("baseline"),
                       report.get("gbdt"), report.get("class_names"))
    (ctx.out_dir / "evaluation" / "gate.md").write_text(md)
    store.log_json(ctx.run_id, decision.to_dict(), "evaluation/gate.json")
    store.log_file(ctx.run_id, ctx.out_dir / "evaluation" / "gate.md", "evaluation")
    create_markdown_artifact(markdown=md, key="gate-decision", description="Evaluation gates")
    if not decision.passed:
        raise GateRejectedError("gate rejected the candidate: " + "; ".join(decision.reasons()), decision.to_dict())
    return decision.to_dict()


@task(name="register", timeout_seconds=300, retries=2, retry_delay_seconds=2, **TASK)
def register(ctx: RunContext, result: dict, report: dict) -> dict:
    """Log the task's pyfunc model, register a version tagged with the manifest, set aliases. Idempotent
    (retries reuse the version this MLflow run registered), so a run never leaves two."""
    from evaluation.champion import deserves
    from registry import models

    reg = log_version(ctx, result, report)
    if reg.get("reused"):
        get_run_logger().info("v%s was registered by an earlier attempt of this run: reused", reg["version"])
    promo = None
    if ctx.cfg.registry.promotion == "auto":
        promo = models.promote_if(reg["name"], reg["version"], lambda current: deserves(
            ctx.task, ctx.cfg, ctx.root, report, current, lambda: _load_champion(ctx)),
                                  promotion_lock(ctx.tracking_uri, ctx.home, reg["name"]))
        get_run_logger().info("promotion of v%s: %s (%s)", reg["version"],
                              "promoted" if promo["promoted"] else "not promoted", promo["reason"])
    reg["promotion"] = promo
    reg["aliases"] = models.aliases_of(reg["name"], reg["version"])
    md = f"# Registered {reg['name']} v{reg['version']}\n\naliases: {', '.join(reg['aliases'])}\n"
    if promo:
        md += f"\npromotion: {promo['reason']}\n"
    create_markdown_artifact(markdown=md, key="registration", description="MLflow model version")
    return reg


def log_version(ctx: RunContext, result: dict, report: dict) -> dict:
    """The task's model spec over the trained program, checked (unless the worker already ran it on
    the whole test split), logged and registered with the manifest and its recorded scores as tags."""
    from evaluation.recorded import record_tags
    from registry import models

    pt2 = Path(result["out_dir"]) / result["model_pt2"]
    spec = ctx.task.model_spec(ctx.cfg, ctx.root, Path(result["out_dir"]), report)
    if not spec.checked:
        ctx.task.check_program(pt2, spec)
    cand = report["candidate"]
    tags = {**ctx.manifest.tags(), "weights_sha256": result["weights_sha256"], "mlflow_run_id": ctx.run_id,
            "trainflow.task": ctx.task.name,
            **{f"test_{k}": f"{cand[k]:.6f}" for k in ctx.task.champion_metrics},
            **(record_tags(report["scoring_key"], cand, ctx.task.recorded_keys()) if report.get("scoring_key") else {})}
    return models.log_version(ctx.run_id, pt2, ctx.cfg.registry.model_name, spec, tags,
                              description=ctx.task.describe(ctx.cfg, cand))


def _load_champion(ctx: RunContext):
    """The registered ``@champion``, loaded to be scored (its files checked against their hashes)."""
    from registry import models

    return models.load_predictor(ctx.cfg.registry.model_name, "champion")


def _training_md(r: dict) -> str:
    from training.goodput import describe

    goodput = describe(r.get("goodput"))  # "" for a result without a ledger
    rows = "\n".join(f"| {h['epoch']} | {h['train_loss']:.4f} | {h['val_loss']:.4f} | "
                     + ("-" if h["val_accuracy"] is None else f"{h['val_accuracy']:.4f}") + f" | {h['samples_per_s']:,.0f} |"
                     for h in r["history"])
    return (f"# Training: {r['status']}\n\nworld size {r['world_size']} ({r['backend']}), global batch "
            f"{r['global_batch']}, effective lr {r['effective_lr']:.5f}, restarts {r['restarts']}, "
            f"wall {r['wall_s']:.1f}s, weights sha256 `{r['weights_sha256'][:16]}`\n\n"
            + (f"{goodput}\n\n" if goodput else "") +
            f"| epoch | train loss | val loss | val acc | samples/s |\n|---|---|---|---|---|\n{rows}\n")


def _run_name() -> str:
    """``<config name>-<data md5[:8]>``, read cheaply from the config and the DVC file."""
    from prefect.runtime import flow_run

    try:
        from core.config import read_config_data
        from core.manifest import read_dvc_file

        p = flow_run.parameters.get("params") or {}
        # Validated first: parameters the flow refuses never make it read a file.
        p = p if isinstance(p, PipelineParams) else PipelineParams.model_validate(p)
        path = run_inputs(p).config_path
        root = project_root(path if path.is_absolute() else Path.cwd() / path)
        path = path if path.exists() else root / path
        raw = read_config_data(path) or {}
        dataset = raw.get("dataset") or {}
        md5 = read_dvc_file(root, dataset.get("dvc_file") or f"{dataset['path']}.dvc").md5
        return f"{raw.get('name', 'trainflow')}-{md5[:8]}"
    except Exception:  # a name must never fail the run; resolve reports the real error
        return "trainflow"


class _Stages:
    """Runs the flow's stages in turn: each one's seconds (``timings``), and which runs now (``stage``)."""

    def __init__(self) -> None:
        self.t0, self.timings, self.stage = time.perf_counter(), {}, "resolve"

    def __call__(self, name: str, fn, *args):
        self.stage, start = name, time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.timings[name] = round(time.perf_counter() - start, 3)


@flow(name="trainflow-pipeline", flow_run_name=_run_name, log_prints=True)
def pipeline(params: PipelineParams = PipelineParams()) -> dict:
    """Validate, train, evaluate, gate and register one config; returns the run summary
    (``core.summary.RunSummary.to_dict``), and an exception raised carries it as ``.summary``. The
    CLI passes its inputs through ``flows.params.from_shell``."""
    from prefect.runtime import flow_run

    from registry import store
    from training.goodput import headline

    quiet_input_errors()
    run = _Stages()
    ctx = run("resolve", resolve, run_inputs(params))
    s = RunSummary(ctx.tracking_uri, ctx.run_id, flow_run.id, ctx.cfg.registry.model_name, ctx.manifest.to_dict(),
                   run.timings)
    monitor = store.system_metrics(ctx.run_id, resume=True)  # stopped by end_run, in every ending
    with ExitStack() as held:  # the training folder, held from `train` until the flow ends
        try:
            s.validated(run("validate", validate, ctx), _data_docs(ctx))
            if ctx.plan.unmeasured:
                ctx = run("measure", measure, ctx)
                s.manifest = ctx.manifest.to_dict()
            slot = held.enter_context(run("train", TrainFolder.claim, ctx))
            result = run("train", train.with_options(timeout_seconds=_train_timeout_s(ctx)), ctx, slot)
            s.trained(result, headline(result.get("goodput")), run("log-training", log_training, ctx, result))
            ev = run("evaluate", evaluate, ctx, result)
            s.evaluated(ctx.task, ev, result["wall_s"])
            s.gates = run("gate", gate, ctx, ev)["checks"]
            s.registered(run("register", register, ctx, result, ev), result["out_dir"])
            store.end_run(ctx.run_id, "FINISHED", stage_tag(s.status, run.stage), monitor)
            return s.to_dict()
        except BaseException as exc:
            s.failed(exc)
            store.end_run(ctx.run_id, "FAILED", stage_tag(s.status, run.stage), monitor)
            exc.summary = s.to_dict()  # the CLI writes it; the exception still fails the flow run
            raise
        finally:
            run.timings["flow"] = round(time.perf_counter() - run.t0, 3)
