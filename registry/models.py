"""Log, register, promote and load models through the MLflow model registry.

The model is a pyfunc logged from code (the task's file, e.g. ``tasks/pyfunc_table.py``, and the modules
it imports in ``code/``) around the ``torch.export`` program: loading it needs mlflow, torch, pandas and
numpy, no installed project code and no pickle.
Versions are addressed by alias only (``@challenger``: the newest registered, ``@champion``: the one serving).
"""

from __future__ import annotations

import importlib
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from registry.store import client, ensure_registered_model, is_not_found
from registry.values import MAX_MODEL_TAG_VALUE_LENGTH, MAX_TAG_VALUE_LENGTH, clean_tags

# Logging and loading models are unsafe in parallel threads (MLflow's models-from-code hand-back and
# torch.export's deserializer are process-wide): every log and load takes the lock program loads take.
from tasks.base import PROGRAM_LOCK, Predictor

log = logging.getLogger(__name__)

CHALLENGER = "challenger"
CHAMPION = "champion"
ARTIFACT_NAME = "model"
# Model metadata naming the task whose pyfunc this is: the loader asks it what the pyfunc takes.
KIND_KEY = "trainflow_kind"
MAX_EXAMPLE_ROWS = 5
# Version tags ``trainflow.sha256/<path in the logged model>``: the sha256 of each file a load runs or reads,
# recorded at registration and checked by ``verify_files`` before a load. The tracking database holds them,
# so a writer of the artifact store alone cannot make a replaced file pass.
HASH_TAG = "trainflow.sha256/"
PROGRAM_FILE = "artifacts/model.pt2"


def pip_requirements(extra: Sequence[str] = ()) -> list[str]:
    """Exact pins of what the pyfunc imports (skipping MLflow's inference, which loads the model in a
    subprocess), ``extra`` distributions included. torch's local suffix (``+cpu``) is dropped: a GPU
    host resolves its own build."""
    from importlib.metadata import version

    return [f"mlflow=={version('mlflow')}", f"torch=={version('torch').split('+')[0]}",
            f"pandas=={version('pandas')}", f"numpy=={version('numpy')}", *(f"{d}=={version(d)}" for d in extra)]


class _Pyfunc:
    """``mlflow.pyfunc`` as ``Model.log``'s flavor, dropping the serving-check switch its ``save_model`` refuses.

    MLflow checks pins by mapping every installed distribution to its modules (the slowest part of
    registering); the same check is made on the pins directly (``requirement_mismatches``).
    """

    __name__ = "mlflow.pyfunc"
    # Where mlflow.pyfunc.save_model looks the check up (tests/integration/test_registry_mlflow.py checks it).
    CHECK = ("mlflow.utils.environment", "warn_dependency_requirement_mismatches")

    @staticmethod
    def save_model(*args, validate_serving_input: bool = True, **kwargs):
        import mlflow.pyfunc

        module, name = importlib.import_module(_Pyfunc.CHECK[0]), _Pyfunc.CHECK[1]
        with PROGRAM_LOCK:
            saved = getattr(module, name, None)
            if saved is not None:
                setattr(module, name, _warn_mismatches)
            try:
                return mlflow.pyfunc.save_model(*args, **kwargs)
            finally:
                if saved is not None:
                    setattr(module, name, saved)


def _warn_mismatches(requirements: Sequence[str], intro: str = "the model's pins differ from this environment"):
    """Warn naming the pins this environment does not satisfy."""
    if mismatches := requirement_mismatches(requirements):
        log.warning("%s:\n - %s", intro, "\n - ".join(mismatches))


def artifact_hashes(model: Path) -> dict[str, str]:
    """``{path in the logged model: sha256}`` of the model artifact: ``model.pt2``, or each file of a
    model folder (a task's ``export_files``: safetensors weights, tokenizer files)."""
    from core.hashing import file_sha256

    if Path(model).is_dir():
        return {f"artifacts/{model.name}/{f.relative_to(model).as_posix()}": file_sha256(f)
                for f in sorted(Path(model).rglob("*")) if f.is_file()}
    return {PROGRAM_FILE: file_sha256(model)}


def log_version(run_id: str, model_pt2: Path, model_name: str, spec, manifest_tags: Mapping[str, Any],
                description: str = "") -> dict:
    """Log the task's pyfunc (``spec``: a ``tasks.base.ModelSpec``) over ``model_pt2`` (or a model folder) to ``run_id``, register
    it as a version of ``model_name`` tagged with the manifest and the files' sha256 (``HASH_TAG``), alias it
    ``@challenger``. A retry reuses the version ``run_id`` registered for this program already.
    Returns ``{"name", "version", "model_uri", "run_id", "model_id", "reused"}``.
    """
    from core.hashing import file_sha256

    model_pt2 = Path(model_pt2)
    if not model_pt2.exists():
        raise FileNotFoundError(f"model program not found: {model_pt2}")
    c = client()
    artifact = artifact_hashes(model_pt2)
    hashes = {**artifact, Path(spec.python_model).name: file_sha256(spec.python_model),
              **{f"code/{Path(p).name}": file_sha256(p) for p in spec.code_paths}}
    try:
        found = c.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    except Exception as exc:
        if not is_not_found(exc):
            raise
        found = []
    done = min((mv for mv in found if all(mv.tags.get(HASH_TAG + k) == v for k, v in artifact.items())),
               key=lambda mv: int(mv.version), default=None)
    if done is not None:
        log.info("%s v%s was registered by run %s already (a retried registration): reused",
                 model_name, done.version, run_id)
        source = str(done.source or "")
        version, model_id = done.version, source.split("/", 1)[1] if source.startswith("models:/") else None
    else:
        version, model_id = _log_new(c, run_id, model_pt2, model_name, spec, manifest_tags, description, hashes)
    if model_id:
        _link_version(c, model_id, model_name, version)
    c.set_registered_model_alias(model_name, CHALLENGER, str(version))
    return {"name": model_name, "version": str(version), "model_uri": f"models:/{model_name}/{version}",
            "run_id": run_id, "model_id": model_id, "reused": done is not None}


def _log_new(c, run_id: str, model_pt2: Path, model_name: str, spec, manifest_tags: Mapping[str, Any],
             description: str, hashes: dict[str, str]) -> tuple[str, str]:
    """Log the pyfunc and register it as a new version: ``(version, LoggedModel id)``."""
    import mlflow
    from mlflow.models import Model

    from core.hashing import file_sha256

    run = c.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="trainflow-model-") as tmp:
        meta_file = Path(tmp, "meta.json")
        meta_file.write_text(json.dumps(spec.meta))
        hashes["artifacts/meta.json"] = file_sha256(meta_file)
        program = model_pt2
        if model_pt2.is_file() and model_pt2.name != Path(PROGRAM_FILE).name:  # kept under its file name
            program = Path(tmp, Path(PROGRAM_FILE).name)
            shutil.copyfile(model_pt2, program)
        with PROGRAM_LOCK, _importable(spec.code_paths):
            # Model.log takes a run_id (mlflow.pyfunc.log_model needs the per-thread fluent run). The
            # LoggedModel is created here too: left to Model.log it lands in the default experiment.
            logged = c.create_logged_model(experiment_id=run.info.experiment_id, name=ARTIFACT_NAME,
                                           source_run_id=run_id, tags=clean_tags(manifest_tags, MAX_TAG_VALUE_LENGTH))
            Model.log(artifact_path=None, name=ARTIFACT_NAME, flavor=_Pyfunc, run_id=run_id, model_id=logged.model_id,
                      python_model=str(spec.python_model), artifacts={"model": str(program), "meta": str(meta_file)},
                      code_paths=[str(p) for p in spec.code_paths],
                      pip_requirements=pip_requirements(spec.requirements),
                      signature=signature_of(spec),
                      input_example=spec.example.head(MAX_EXAMPLE_ROWS).reset_index(drop=True),
                      metadata=spec.metadata or None,
                      validate_serving_input=not spec.checked)  # checked: the same program file ran already
        # MLflow writes MLmodel (naming the code file, the loader, the artifacts) as it logs: hashed as stored.
        Path(tmp, "stored").mkdir()
        hashes["MLmodel"] = file_sha256(mlflow.artifacts.download_artifacts(
            artifact_uri=f"{logged.artifact_location.rstrip('/')}/MLmodel", dst_path=str(Path(tmp, "stored"))))
    ensure_registered_model(c, model_name)
    return c.create_model_version(
        name=model_name, source=f"models:/{logged.model_id}", run_id=run_id, description=description or None,
        tags=clean_tags({**manifest_tags, **{HASH_TAG + k: v for k, v in hashes.items()}}, MAX_MODEL_TAG_VALUE_LENGTH),
        model_id=logged.model_id).version, logged.model_id


@contextmanager
def _importable(paths: Sequence[Path]):
    """The folders of ``paths`` first on ``sys.path`` while MLflow runs the pyfunc file to log it, as the
    logged model's ``code/`` folder is when it loads."""
    folders = list(dict.fromkeys(str(Path(p).parent) for p in paths))
    sys.path[:0] = folders
    try:
        yield
    finally:
        for folder in folders:
            sys.path.remove(folder)


def signature_of(spec):
    """The MLflow signature of a ``ModelSpec``: its input columns, its output, and the inference params
    ``predict`` takes (MLflow passes declared ones through, its scoring server too, and drops others)."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec(t, n) for n, t in spec.inputs] + [
                              ColSpec(AnyType(), n, required=False) for n in spec.optional_inputs]),
                          outputs=Schema([ColSpec(t, n) for n, t in spec.outputs]),
                          params=ParamSchema([ParamSpec(n, t, d) for n, t, d in spec.params]) if spec.params else None)


def _link_version(c, model_id: str, model_name: str, version) -> None:
    """List the version in the LoggedModel's ``mlflow.modelVersions`` tag (once), as a tracking server does;
    registering through the client on a database URI does not, and the UI then says "Not registered"."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    listed = json.loads(c.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    if not any(v.get("name") == model_name and str(v.get("version")) == str(version) for v in listed):
        c.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
            [*listed, {"name": model_name, "version": str(version)}])})


def verify_files(folder: Path, model_name: str, mv, alias: str | None = None) -> None:
    """Refuse (IntegrityError) a downloaded version ``mv`` in ``folder`` unless each file whose sha256 was
    recorded at registration still has it. ``MLmodel`` must be among them: it names the code file, the
    loader and the artifacts a load runs. ``alias``: the alias it was reached by, named in the error."""
    from core.errors import IntegrityError
    from core.hashing import file_sha256

    recorded = {k[len(HASH_TAG):]: v for k, v in (mv.tags or {}).items() if k.startswith(HASH_TAG)}
    what = f"{model_name} v{mv.version}" + (f" (@{alias})" if alias else "")
    if "MLmodel" not in recorded:
        raise IntegrityError(
            f"{what}: no sha256 of its files was recorded at registration (registered by another tool or by "
            f"trainflow before it recorded them), so what the artifact store holds cannot be checked; refusing "
            f"to load it. Register the model again with trainflow"
            + (f", or take the alias off it: MlflowClient().delete_registered_model_alias({model_name!r}, "
               f"{alias!r})" if alias else ""))
    for rel, want in sorted(recorded.items(), key=lambda kv: kv[0] != "MLmodel"):
        path = Path(folder) / rel
        got = file_sha256(path) if path.is_file() else "(missing)"
        if got != want:
            raise IntegrityError(f"{what}: {rel} in the artifact store has sha256 {got}, but {want} was recorded "
                                 f"at registration; refusing to load it (it was changed after registration)")


def promote(model_name: str, version: str, alias: str = CHAMPION) -> None:
    """Point ``@alias`` at ``version`` (moving it off whichever version had it)."""
    client().set_registered_model_alias(model_name, alias, str(version))


def _info(mv) -> dict | None:
    return None if mv is None else {"version": str(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags)}


def promote_if(model_name: str, version: str, still_deserves: Callable[[dict | None], tuple[bool, str]],
               lock: AbstractContextManager, alias: str = CHAMPION) -> dict:
    """Move ``@alias`` to ``version`` only if it beats the holder *at promotion time*.

    MLflow has no compare-and-set on aliases, so read-decide-set runs inside ``lock``, which every
    promoter of this model enters on any host (``flows.promotion.promotion_lock``).
    ``still_deserves(current)`` gets the holder as ``champion_version`` returns it and answers
    ``(promote?, reason)``. The alias is read back after: a writer that bypasses the lock shows up as
    ``confirmed: false``. Returns ``{"promoted", "reason", "previous", "champion", "confirmed"}``.
    """
    with lock:
        info = _info(version_by_alias(model_name, alias))
        previous = info["version"] if info else None
        if previous == str(version):
            return {"promoted": False, "reason": f"version {version} already holds @{alias}",
                    "previous": previous, "champion": previous, "confirmed": True}
        ok, reason = still_deserves(info)
        if ok:
            promote(model_name, version, alias)
        after = version_by_alias(model_name, alias)
    now = str(after.version) if after is not None else None
    return {"promoted": ok, "reason": reason, "previous": previous, "champion": now,
            "confirmed": now == (str(version) if ok else previous)}


def aliases_of(model_name: str, version: str) -> list[str]:
    return sorted(client().get_model_version(model_name, str(version)).aliases)


def version_by_alias(model_name: str, alias: str):
    """The ModelVersion behind ``name@alias``, or None when the model or the alias is missing (read through
    the alias map: the sqlite store reports a missing alias as INVALID_PARAMETER_VALUE, like a real error)."""
    c = client()
    try:
        version = c.get_registered_model(model_name).aliases.get(alias)
        return None if version is None else c.get_model_version(model_name, str(version))
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def champion_version(model_name: str) -> dict | None:
    """``{"version", "run_id", "tags"}`` of the version carrying ``@champion``, else None."""
    return _info(version_by_alias(model_name, CHAMPION))


def requirement_mismatches(requirements: Sequence[str]) -> list[str]:
    """``"name (current: X, required: spec)"`` for each pin this environment does not satisfy; lines that
    are not plain requirements (options, paths, URLs) are skipped, a local suffix (``+cpu``) ignored."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import Version

    out = []
    for line in requirements:
        line = line.split("#", 1)[0].strip()
        try:
            req = Requirement(line)
        except InvalidRequirement:  # blank, an option, a path or a URL
            continue
        if req.marker and not req.marker.evaluate():
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            installed = None
        if installed is None or (req.specifier and not req.specifier.contains(Version(installed).public,
                                                                              prereleases=True)):
            out.append(f"{req.name} (current: {installed or 'uninstalled'}, required: {line})")
    return out


def load_predictor(model_name: str, alias: str = CHAMPION) -> Callable | None:
    """Load ``models:/<name>@<alias>`` as its task's ``loaded_model`` (a :class:`Predictor` for a table);
    None without the alias. ``.version`` names what the alias held when resolved; the files are
    checked against the sha256 recorded at registration (``verify_files``) before anything in them runs."""
    import mlflow

    from core.errors import ConfigError
    from tasks import get_task

    mv = version_by_alias(model_name, alias)
    if mv is None:
        return None
    uri = f"models:/{model_name}/{mv.version}"
    # load_context reads the program into memory, so the downloaded copy can go.
    with PROGRAM_LOCK, tempfile.TemporaryDirectory(prefix="trainflow-load-") as dst:
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst))
        verify_files(local, model_name, mv, alias)
        model = mlflow.pyfunc.load_model(str(local), suppress_warnings=True)
        if (local / "requirements.txt").is_file():
            _warn_mismatches((local / "requirements.txt").read_text().splitlines(),
                             f"{uri} was logged with other package versions than this environment has")
    kind = (model.metadata.metadata or {}).get(KIND_KEY)
    try:  # the task's own wrapper (a language model's takes a text column)
        loaded = get_task(kind).loaded_model() if isinstance(kind, str) else Predictor
    except ConfigError:  # a task unknown here: a plain Predictor
        loaded = Predictor
    return loaded(model, model_name, alias, str(mv.version), mv.run_id, uri)
