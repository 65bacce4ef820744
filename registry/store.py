"""MLflow tracking set-up and run logging, through ``MlflowClient`` only.

Flow tasks run in threads, so nothing here uses MLflow's fluent active-run state: every call names
its run id. ``configure`` sets the process-wide tracking and registry URI once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from core.locks import exclusive
from registry.values import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    check_run_status,
    chunks,
    clean_tags,
    dataset_source,
    flatten_metrics,
    flatten_params,
)

log = logging.getLogger(__name__)

_CONFIGURE_LOCK = threading.Lock()

# The run tag that says where a pipeline run is, and at its end how it ended (``flows.pipeline``).
STAGE_TAG = "trainflow.stage"
SYSTEM_METRICS_INTERVAL_S = 2.0
# A run's recorded inputs (manifest.json, config.json): the sha256 of each, as a run tag in the
# tracking database, checked by every reader (``load_recorded``) before it acts on the file.
RECORDED_TAG = "trainflow.sha256/"


def client():
    """An ``MlflowClient`` on the URI ``configure`` set (cheap: the store is cached per URI)."""
    from mlflow import MlflowClient

    return MlflowClient()


def is_not_found(exc: Exception) -> bool:
    return str(getattr(exc, "error_code", "")) in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


def is_already_exists(exc: Exception) -> bool:
    return str(getattr(exc, "error_code", "")) in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS")


def ensure_registered_model(c, name: str, **kwargs) -> None:
    """Create the registered model ``name`` unless it exists."""
    try:
        c.create_registered_model(name, **kwargs)
    except Exception as exc:
        if not is_already_exists(exc):
            raise


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (absolute with four slashes), else None."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    rest = tracking_uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def experiment_artifact_location(artifact_root: Path, experiment: str) -> str:
    """``file:///abs/artifact_root/<experiment>``; odd characters in the name become ``_``."""
    folder = re.sub(r"[^\w.\-]", "_", experiment).strip(".") or "experiment"
    return f"{Path(artifact_root).resolve().as_uri()}/{folder}"


def is_server(tracking_uri: str) -> bool:
    """True for a tracking server (``http(s)://``): it owns where artifacts go."""
    return tracking_uri.split(":", 1)[0].lower() in ("http", "https")


def configure(tracking_uri: str, experiment: str, artifact_root: Path) -> str:
    """Point MLflow at ``tracking_uri``; get or create ``experiment`` (restored if deleted); return its id.
    A new experiment keeps artifacts under ``artifact_root/<experiment>`` (not ``./mlruns`` of the cwd), or
    where a tracking server says; an existing one keeps its location (a warning says if it differs)."""
    import mlflow

    db = sqlite_path(tracking_uri)
    if db is not None:
        if not db.is_absolute():
            log.warning("sqlite tracking URI %s is relative to the working directory; "
                        "use sqlite:////abs/path.db (four slashes)", tracking_uri)
        db.parent.mkdir(parents=True, exist_ok=True)  # sqlite creates the file but not its folder
    location = None
    if not is_server(tracking_uri):
        Path(artifact_root).mkdir(parents=True, exist_ok=True)
        location = experiment_artifact_location(artifact_root, experiment)
    # Two processes opening a new sqlite database at once both create the schema and one fails: the
    # first open is serialised by a lock beside it.
    init_lock = exclusive(db.parent / f"{db.name}.init.lock") if db is not None else nullcontext()
    with _CONFIGURE_LOCK, init_lock:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)  # not left to MLFLOW_REGISTRY_URI or the scheme's default
        c = client()
        exp = c.get_experiment_by_name(experiment)
        if exp is None:
            try:
                return c.create_experiment(experiment, artifact_location=location)
            except Exception as exc:  # another thread or process created it first
                if not is_already_exists(exc) or (exp := c.get_experiment_by_name(experiment)) is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            c.restore_experiment(exp.experiment_id)
            log.warning("experiment %r was deleted; restored it", experiment)
        if location and exp.artifact_location.rstrip("/") != location.rstrip("/"):
            log.warning("experiment %r keeps its artifact location %s (not %s)",
                        experiment, exp.artifact_location, location)
        return exp.experiment_id


def start_run(experiment_id: str, run_name: str, tags: Mapping[str, Any]) -> str:
    """Create a RUNNING run in ``experiment_id`` and return its id (no active-run state)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    run_tags = clean_tags(tags or {})
    run_tags.setdefault(MLFLOW_RUN_NAME, run_name)
    return client().create_run(str(experiment_id), run_name=run_name, tags=run_tags).info.run_id


def end_run(run_id: str, status: str = "FINISHED", stage: str | None = None, monitor=None) -> None:
    """Terminate a run as ``FINISHED``, ``FAILED`` or ``KILLED``, first setting its ``trainflow.stage`` tag
    to ``stage`` when given. ``monitor`` (``system_metrics``'s) is stopped before both, even when they fail."""
    status = check_run_status(status)
    try:
        if monitor is not None:
            monitor.finish()
    finally:
        if stage is not None:
            set_tags(run_id, {STAGE_TAG: stage})
        client().set_terminated(run_id, status)


def reopen_run(folders: list[Path], config_id: str, experiment_id: str, tags: Mapping[str, Any],
               logger: logging.Logger = log) -> str | None:
    """The MLflow run of the interrupted training in the first of ``folders`` that records one, set
    RUNNING again with ``tags``; None when none does, or when its run record does not name a run of
    ``experiment_id`` that the store confirms (a new run is then the caller's)."""
    from core.metrics_file import read_run_record, verify_recorded_run

    c = client()
    for folder in folders:
        rec = read_run_record(folder)
        if rec is None:
            continue
        problem = verify_recorded_run(c.get_run, rec, config_id, folder)
        if problem is None and c.get_run(rec["run_id"]).info.experiment_id != str(experiment_id):
            problem = f"run {rec['run_id']} is in another experiment"
        if problem:
            logger.warning("a new MLflow run for the training resumed in %s: %s", folder.name, problem)
            return None
        c.update_run(rec["run_id"], status="RUNNING")
        set_tags(rec["run_id"], tags)
        logger.info("resuming the interrupted training in %s: its MLflow run %s goes on", folder.name, rec["run_id"])
        return rec["run_id"]
    return None


def system_metrics(run_id: str, interval_s: float = SYSTEM_METRICS_INTERVAL_S, resume: bool = False):
    """Start MLflow's system metrics monitor (a daemon thread) on ``run_id``, for ``end_run`` to stop; None
    when it cannot start or ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is false. ``resume``: after the last step."""
    if os.environ.get("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "").strip().lower() in ("false", "0"):
        return None
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop lines are INFO
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=resume)
        # From step 1: MLflow links the run's step-0 metrics (the evaluation's) to the model logged at step 0.
        monitor._logging_step = max(getattr(monitor, "_logging_step", 0), 1)
        monitor.start()
    except Exception as exc:  # psutil missing, a store error: the run goes on without them
        log.warning("system metrics not recorded for run %s: %s", run_id, exc)
        return None
    return monitor


def log_datasets(run_id: str, splits: Mapping[str, tuple[str, str]], digest: str, rev: str) -> None:
    """Log each split ``{name: (file relative to the project root, context)}`` as a dataset input of
    ``run_id`` with source ``dvc://<file>@<rev>`` and the DVC md5 ``digest``. Nothing is read."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    inputs = [DatasetInput(Dataset(name, digest, "dvc", dataset_source(path, rev)),
                           [InputTag(MLFLOW_DATASET_CONTEXT, context)])
              for name, (path, context) in splits.items()]
    if inputs:
        client().log_inputs(run_id, datasets=inputs)


def _log_batches(run_id: str, kind: str, values: list) -> None:
    """``values`` logged as ``kind`` ("params", "tags" or "metrics") in batches MLflow accepts."""
    size = MAX_METRICS_PER_BATCH if kind == "metrics" else MAX_PARAMS_TAGS_PER_BATCH
    c = client()
    for batch in chunks(values, size):
        c.log_batch(run_id, **{kind: batch})


def set_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    _log_batches(run_id, "tags", [RunTag(k, v) for k, v in clean_tags(tags).items()])


def log_params(run_id: str, params: Mapping[str, Any]) -> dict[str, str]:
    """Log ``params`` flattened to dotted keys, values as strings cut to MLflow's limit; return them.
    MLflow params are write-once: a key logged again with a different value raises."""
    from mlflow.entities import Param

    flat = flatten_params(params)
    _log_batches(run_id, "params", [Param(k, v) for k, v in flat.items()])
    return flat


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int | None = None) -> dict[str, float]:
    """Log numeric ``metrics`` (nested mappings flattened to dotted names) at ``step``; return them.
    Raises TypeError for a non-numeric value before anything is logged."""
    from mlflow.entities import Metric

    flat = flatten_metrics(metrics)
    now = int(time.time() * 1000)
    _log_batches(run_id, "metrics", [Metric(k, v, now, int(step or 0)) for k, v in flat.items()])
    return flat


def log_json(run_id: str, obj: Any, artifact_file: str) -> None:
    """Write ``obj`` as JSON (or YAML for a .yaml/.yml name) to ``artifact_file`` in the run."""
    client().log_dict(run_id, obj, artifact_file)


def log_recorded(run_id: str, obj: Any, artifact_file: str) -> None:
    """Log ``obj`` as JSON to ``artifact_file`` and tag the run with the file's sha256 (``load_recorded``)."""
    data = json.dumps(obj, indent=2, sort_keys=True).encode()
    c = client()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(artifact_file).name
        path.write_bytes(data)
        c.log_artifact(run_id, str(path), str(Path(artifact_file).parent) if "/" in artifact_file else None)
    c.set_tag(run_id, RECORDED_TAG + artifact_file, hashlib.sha256(data).hexdigest())


def load_recorded(run_id: str, artifact_file: str, unrecorded_ok: bool = False) -> dict | None:
    """``artifact_file`` of the run as ``log_recorded`` wrote it; None when the run has no such file.
    Raises IntegrityError when its sha256 differs from the run's tag, or none was recorded (with
    ``unrecorded_ok``, a run logged before hashes were recorded gives None: its file is not used)."""
    import mlflow

    from core.errors import IntegrityError

    with tempfile.TemporaryDirectory() as tmp:
        try:
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_file, dst_path=tmp)
        except Exception:  # noqa: BLE001 - no such artifact: the caller says what that means
            return None
        data = Path(local).read_bytes()
    want = client().get_run(run_id).data.tags.get(RECORDED_TAG + artifact_file)
    got = hashlib.sha256(data).hexdigest()
    if want is None:
        if unrecorded_ok:
            return None
        raise IntegrityError(f"run {run_id}: no sha256 of {artifact_file} was recorded (not logged by this version "
                             f"of trainflow), so the artifact store's copy cannot be checked; refusing to use it")
    if got != want:
        raise IntegrityError(f"run {run_id}: {artifact_file} in the artifact store has sha256 {got}, but {want} was "
                             f"recorded; refusing to use it (it was changed after it was logged)")
    return json.loads(data)


def log_file(run_id: str, path: Path, artifact_path: str | None = None) -> None:
    """Copy a file (or a whole folder's contents) into the run's artifacts."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"cannot log {path}: no such file or folder")
    c = client()
    (c.log_artifacts if path.is_dir() else c.log_artifact)(run_id, str(path), artifact_path)
