"""Log, register, promote and load models through the MLflow model registry.

The model is a pyfunc logged *from code* (the task's file, e.g. ``tasks/pyfunc_table.py``)
around the ``torch.export`` program, so loading it needs mlflow, torch, pandas and
numpy but no project code and no pickle. Versions are addressed by alias only
(``@challenger`` for the newest registered version, ``@champion`` for the one
serving); registry stages are never used.

MLflow, torch, pandas and numpy are imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from registry.store import client, is_already_exists, is_not_found
from tasks.base import PROGRAM_LOCK
from registry.values import MAX_MODEL_TAG_VALUE_LENGTH, MAX_TAG_VALUE_LENGTH, clean_tags

CHALLENGER = "challenger"
CHAMPION = "champion"
ARTIFACT_NAME = "model"
# Model metadata key naming the task whose pyfunc this is: the loader asks it what the pyfunc
# takes (a task whose evaluator scores "documents", e.g. tasks/lm.py's, takes a text column).
KIND_KEY = "trainflow_kind"
# Rows of the input example stored with the model (enough to document the shape).
MAX_EXAMPLE_ROWS = 5
# Version tags ``trainflow.sha256/<path in the logged model>``: the sha256 of each file a load runs or
# reads (MLmodel, the models-from-code file, the program, its meta.json), recorded at registration
# and checked by ``verify_files`` before a load. The tracking database holds them, so a writer of the
# artifact store alone cannot make a replaced file pass.
HASH_TAG = "trainflow.sha256/"
PROGRAM_FILE = "artifacts/model.pt2"

# Logging and loading models are unsafe in parallel threads (two process-wide globals: MLflow's
# models-from-code hand-back and torch.export's deserializer): every log and load here takes
# the lock the tasks' program loads take too.
_MODEL_CODE_LOCK = PROGRAM_LOCK


def pip_requirements() -> list[str]:
    """Exact pins of what the pyfunc file imports, from this environment.

    Giving them explicitly skips MLflow's requirement inference (seconds: it
    loads the model in a subprocess). torch's local suffix (``+cpu``) is dropped
    so a GPU host resolves its own build of the same version.
    """
    from importlib.metadata import version

    # From the installed distributions' metadata: the same versions the modules report, without
    # importing torch (1.5-2 s) into a process that may never need it.
    return [
        f"mlflow=={version('mlflow')}",
        f"torch=={version('torch').split('+')[0]}",
        f"pandas=={version('pandas')}",
        f"numpy=={version('numpy')}",
    ]


def _ensure_registered_model(c, model_name: str) -> None:
    try:
        c.create_registered_model(model_name)
    except Exception as exc:
        if not is_already_exists(exc):
            raise


class _Pyfunc:
    """``mlflow.pyfunc`` as ``Model.log``'s flavor, taking the serving-check switch.

    ``Model.log`` reads ``validate_serving_input`` from its keyword arguments (the transformers
    flavor passes it), then hands every keyword to the flavor's ``save_model``, which for pyfunc
    refuses unknown ones; this flavor drops the switch before calling ``mlflow.pyfunc.save_model``.

    MLflow checks the given pins against the environment by first mapping every installed
    distribution to its modules (``importlib.metadata.packages_distributions``: a scan of every
    package's file list, the slowest part of registering). The pins here are this environment's
    own versions (``pip_requirements``), so the same check is made directly on them instead
    (``requirement_mismatches``), and still warns on a mismatch.
    """

    __name__ = "mlflow.pyfunc"
    # Where mlflow.pyfunc.save_model looks the check up (tests/unit/test_registry_values.py checks it exists).
    CHECK = ("mlflow.utils.environment", "warn_dependency_requirement_mismatches")

    @staticmethod
    def save_model(*args, validate_serving_input: bool = True, **kwargs):
        import importlib

        import mlflow.pyfunc

        module = importlib.import_module(_Pyfunc.CHECK[0])
        with _MODEL_CODE_LOCK:
            saved = getattr(module, _Pyfunc.CHECK[1], None)
            if saved is not None:
                setattr(module, _Pyfunc.CHECK[1], _warn_mismatches)
            try:
                return mlflow.pyfunc.save_model(*args, **kwargs)
            finally:
                if saved is not None:
                    setattr(module, _Pyfunc.CHECK[1], saved)


def _warn_mismatches(requirements: list[str]) -> None:
    """MLflow's requirement check, made on the pins themselves (see ``_Pyfunc``)."""
    import logging

    mismatches = requirement_mismatches(requirements)
    if mismatches:
        logging.getLogger(__name__).warning("the model's pins differ from this environment:\n - %s",
                                            "\n - ".join(mismatches))


def signature(spec):
    """The MLflow signature of a task's ``ModelSpec``: typed input columns, typed outputs."""
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    return ModelSignature(inputs=Schema([ColSpec(t, name) for name, t in spec.inputs]),
                          outputs=Schema([ColSpec(t, name) for name, t in spec.outputs]))


def log_version(run_id: str, model_pt2: Path, model_name: str, spec, manifest_tags: Mapping[str, Any],
                description: str = "") -> dict:
    """Log the task's pyfunc (``spec``: a ``tasks.base.ModelSpec``) over ``model_pt2`` to ``run_id``,
    register it as a version of ``model_name`` tagged with the manifest and the sha256 of the files a
    load runs (``HASH_TAG``), alias it ``@challenger``.

    Idempotent per (run, program): when ``run_id`` already registered this very program (a retry
    after a failure that came after the version was created), that version is reused, not a new one.

    Returns ``{"name", "version", "model_uri", "run_id", "model_id", "reused"}``.
    """
    model_pt2 = Path(model_pt2)
    if not model_pt2.is_file():
        raise FileNotFoundError(f"model program not found: {model_pt2}")
    example = spec.example.head(MAX_EXAMPLE_ROWS).reset_index(drop=True)
    return _log_and_register(run_id, model_name, model_pt2, spec.meta, spec.python_model, signature(spec), example,
                             manifest_tags, description, metadata=spec.metadata or None,
                             validate_serving=not spec.checked)


def _registration(model_name: str, version, run_id: str, model_id: str | None, reused: bool) -> dict:
    return {"name": model_name, "version": str(version), "model_uri": f"models:/{model_name}/{version}",
            "run_id": run_id, "model_id": model_id, "reused": reused}


def registered_for_run(model_name: str, run_id: str, program_sha256: str):
    """The version of ``model_name`` that ``run_id`` registered for the program with this sha256
    (the lowest, should there be several), else None."""
    try:
        found = client().search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise
    same = [mv for mv in found if mv.tags.get(HASH_TAG + PROGRAM_FILE) == program_sha256]
    return min(same, key=lambda mv: int(mv.version), default=None)


def _log_and_register(run_id: str, model_name: str, model_pt2: Path, meta: dict, python_model: Path,
                      signature, example, manifest_tags: Mapping[str, Any], description: str,
                      metadata: dict | None = None, validate_serving: bool = True) -> dict:
    """Log ``python_model`` (models-from-code over ``model_pt2`` + ``meta``) to ``run_id``, register
    it as a version of ``model_name`` tagged with the manifest and the files' sha256, and alias it
    ``@challenger``; or reuse the version this run registered already for the same program.

    ``validate_serving``: MLflow loads the logged model and predicts its input example (the
    serving check). False skips that when the caller has run the same program file already."""
    import logging

    from mlflow.models import Model

    from core.hashing import file_sha256

    c = client()
    hashes = {PROGRAM_FILE: file_sha256(model_pt2), Path(python_model).name: file_sha256(python_model)}
    done = registered_for_run(model_name, run_id, hashes[PROGRAM_FILE])
    if done is not None:
        logging.getLogger(__name__).info("%s v%s was registered by run %s already (a retried registration): "
                                         "reused", model_name, done.version, run_id)
        c.set_registered_model_alias(model_name, CHALLENGER, str(done.version))
        source = str(done.source or "")
        model_id = source.split("/", 1)[1] if source.startswith("models:/") else None
        if model_id:
            _link_version(c, model_id, model_name, done.version)
        return _registration(model_name, done.version, run_id, model_id, True)
    run = c.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="trainflow-model-") as tmp:
        meta_file = Path(tmp, "meta.json")
        meta_file.write_text(json.dumps(meta))
        hashes["artifacts/meta.json"] = file_sha256(meta_file)
        program = model_pt2
        if model_pt2.name != Path(PROGRAM_FILE).name:  # the pyfunc keeps an artifact under its file name
            program = Path(tmp, Path(PROGRAM_FILE).name)
            shutil.copyfile(model_pt2, program)
        with _MODEL_CODE_LOCK:
            # mlflow.pyfunc.log_model takes no run_id (it needs the fluent active
            # run, which is per-thread state we avoid); Model.log does. Create the
            # LoggedModel ourselves too: left to Model.log it lands in the *default*
            # experiment (id 0, artifacts under ./mlruns of the cwd at database
            # creation), because the fluent experiment id wins over the run's.
            logged = c.create_logged_model(
                experiment_id=run.info.experiment_id,
                name=ARTIFACT_NAME,
                source_run_id=run_id,
                tags=clean_tags(manifest_tags, MAX_TAG_VALUE_LENGTH),
            )
            Model.log(
                artifact_path=None,
                name=ARTIFACT_NAME,
                flavor=_Pyfunc,
                run_id=run_id,
                model_id=logged.model_id,
                python_model=str(python_model),
                artifacts={"model": str(program), "meta": str(meta_file)},
                pip_requirements=pip_requirements(),
                signature=signature,
                input_example=example,
                metadata=metadata,
                validate_serving_input=validate_serving,
            )
        # MLmodel (which names the code file, the loader and the artifacts) is written by MLflow
        # as it logs: hashed as stored.
        hashes["MLmodel"] = _stored_sha256(f"{logged.artifact_location.rstrip('/')}/MLmodel", Path(tmp, "stored"))

    _ensure_registered_model(c, model_name)
    version = c.create_model_version(
        name=model_name,
        source=f"models:/{logged.model_id}",
        run_id=run_id,
        tags=clean_tags({**manifest_tags, **{HASH_TAG + k: v for k, v in hashes.items()}},
                        MAX_MODEL_TAG_VALUE_LENGTH),
        description=description or None,
        model_id=logged.model_id,
    )
    _link_version(c, logged.model_id, model_name, version.version)
    c.set_registered_model_alias(model_name, CHALLENGER, str(version.version))
    return _registration(model_name, version.version, run_id, logged.model_id, False)


def _link_version(c, model_id: str, model_name: str, version) -> None:
    """Tag the LoggedModel with the registry versions made from it (``mlflow.modelVersions``), as a
    tracking server and ``mlflow.register_model`` do; registering through the client on a database
    URI does not, and the LoggedModel page then says "Not registered". Each version is listed once."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    listed = json.loads(c.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    if not any(v.get("name") == model_name and str(v.get("version")) == str(version) for v in listed):
        c.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
            [*listed, {"name": model_name, "version": str(version)}])})


def _stored_sha256(artifact_uri: str, dst: Path) -> str:
    import mlflow

    from core.hashing import file_sha256

    dst.mkdir(parents=True, exist_ok=True)
    return file_sha256(mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=str(dst)))


def verify_files(folder: Path, model_name: str, mv, alias: str | None = None) -> None:
    """Refuse (IntegrityError) a downloaded version ``mv`` of ``model_name`` in ``folder`` unless each
    file whose sha256 was recorded on it at registration still has it. ``MLmodel`` must be among
    them: it names the code file, the loader and the artifacts a load runs and reads. ``alias``:
    the alias it was reached by, named in the error."""
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


def promote_if(model_name: str, version: str, still_deserves: Callable[[dict | None], tuple[bool, str]],
               lock: AbstractContextManager, alias: str = CHAMPION) -> dict:
    """Move ``@alias`` to ``version`` only if it beats the holder *at promotion time*.

    MLflow has no compare-and-set on aliases, so read-decide-set runs inside ``lock``: a context
    manager every promoter of this model enters, on any host (``flows.promotion.promotion_lock``:
    the registry's own lease, ``registry.lease``). ``still_deserves(current)`` gets the current
    holder as ``champion_version`` returns it (None when there is none) and answers
    ``(promote?, reason)``. After setting, the alias is read back; a writer that bypasses the
    lock (another tool) can still interleave: that shows up as ``confirmed: false``.

    Returns ``{"promoted", "reason", "previous", "champion", "confirmed"}``.
    """
    with lock:
        current = version_by_alias(model_name, alias)
        info = None if current is None else {"version": str(current.version), "run_id": current.run_id,
                                             "tags": dict(current.tags)}
        if info is not None and info["version"] == str(version):
            return {"promoted": False, "reason": f"version {version} already holds @{alias}",
                    "previous": info["version"], "champion": info["version"], "confirmed": True}
        ok, reason = still_deserves(info)
        if ok:
            client().set_registered_model_alias(model_name, alias, str(version))
        after = version_by_alias(model_name, alias)
    now = str(after.version) if after is not None else None
    expected = str(version) if ok else (info["version"] if info else None)
    return {"promoted": ok, "reason": reason, "previous": info["version"] if info else None,
            "champion": now, "confirmed": now == expected}


def aliases_of(model_name: str, version: str) -> list[str]:
    return sorted(client().get_model_version(model_name, str(version)).aliases)


def version_by_alias(model_name: str, alias: str):
    """The ModelVersion behind ``name@alias``, or None when the model or the alias is missing.

    Looked up through the registered model's alias map: ``get_model_version_by_alias``
    reports a missing alias as INVALID_PARAMETER_VALUE on the sqlite store, which
    cannot be told apart from a real error.
    """
    c = client()
    try:
        version = c.get_registered_model(model_name).aliases.get(alias)
        if version is None:
            return None
        return c.get_model_version(model_name, str(version))
    except Exception as exc:
        if is_not_found(exc):
            return None
        raise


def champion_version(model_name: str) -> dict | None:
    """``{"version", "run_id", "tags"}`` of the version carrying ``@champion``, else None."""
    mv = version_by_alias(model_name, CHAMPION)
    if mv is None:
        return None
    return {"version": str(mv.version), "run_id": mv.run_id, "tags": dict(mv.tags)}


class _Loaded:
    """A pyfunc loaded from the registry, with where it came from."""

    def __init__(self, pyfunc_model, name: str, alias: str, version: str, run_id: str | None,
                 model_uri: str):
        self.pyfunc = pyfunc_model
        self.name = name
        self.alias = alias
        self.version = version
        self.run_id = run_id
        self.model_uri = model_uri


class Predictor(_Loaded):
    """A loaded registry model of a table: ``predictor(features) -> predictions`` (the original
    class labels, or regression values).

    ``features`` is a DataFrame holding the feature columns (by name, in their own types), or a
    ``[rows, n_features]`` array in feature-column order.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        schema = self.pyfunc.metadata.get_input_schema()
        self.feature_columns = list(schema.input_names()) if schema is not None else []

    def __call__(self, features):
        import numpy as np
        import pandas as pd

        if not isinstance(features, pd.DataFrame):
            values = np.asarray(features)
            if values.ndim == 1:
                values = values[None, :]
            features = pd.DataFrame(values, columns=self.feature_columns)
        return np.asarray(self.pyfunc.predict(features))

    def __repr__(self) -> str:
        return f"Predictor({self.name}@{self.alias} = version {self.version})"


class TextScorer(_Loaded):
    """A loaded registry language model: ``scorer(texts) -> (loss [n], n_tokens [n])``.

    ``texts`` is a list of strings or a DataFrame with a ``text`` column; ``.frame(texts)`` gives
    the pyfunc's whole output (``loss, perplexity, n_tokens`` per document).
    """

    def frame(self, texts):
        import pandas as pd

        if not isinstance(texts, pd.DataFrame):
            texts = pd.DataFrame({"text": list(texts)})
        return self.pyfunc.predict(texts)

    def __call__(self, texts):
        import numpy as np

        out = self.frame(texts)
        return np.asarray(out["loss"], dtype=np.float64), np.asarray(out["n_tokens"], dtype=np.int64)

    def __repr__(self) -> str:
        return f"TextScorer({self.name}@{self.alias} = version {self.version})"


def requirement_mismatches(requirements: Sequence[str]) -> list[str]:
    """``"name (current: X, required: spec)"`` for each ``name<spec>`` pin this environment does not
    satisfy; lines that are not plain requirements (options, paths, URLs) are skipped. A local
    version suffix (``+cpu``) is ignored, as ``pip_requirements`` drops it when logging."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import Version

    out = []
    for line in requirements:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker and not req.marker.evaluate():
            continue
        try:
            installed = version(req.name)
        except PackageNotFoundError:
            out.append(f"{req.name} (current: uninstalled, required: {line})")
            continue
        if req.specifier and not req.specifier.contains(Version(installed).public, prereleases=True):
            out.append(f"{req.name} (current: {installed}, required: {line})")
    return out


def warn_requirement_mismatches(requirements_file: Path, model_uri: str) -> list[str]:
    """Log a warning naming the pins of a downloaded model this environment does not satisfy."""
    import logging

    if not requirements_file.is_file():
        return []
    mismatches = requirement_mismatches(requirements_file.read_text().splitlines())
    if mismatches:
        logging.getLogger(__name__).warning(
            "%s was logged with other package versions than this environment has:\n - %s",
            model_uri, "\n - ".join(mismatches))
    return mismatches


def load_predictor(model_name: str, alias: str = CHAMPION) -> Callable | None:
    """Load ``models:/<name>@<alias>`` as a :class:`Predictor`; None when there is no such alias.

    A language model (its metadata says ``trainflow_kind: lm``) loads as a :class:`TextScorer`.

    The alias is resolved once and that version loaded, so ``.version`` names exactly what
    predicts even if the alias moves meanwhile. Its files are downloaded, checked against the
    sha256 recorded at registration (``verify_files``: IntegrityError, before anything in them
    runs or is unpickled) and loaded from that checked copy.
    """
    import mlflow

    mv = version_by_alias(model_name, alias)
    if mv is None:
        return None
    uri = f"models:/{model_name}/{mv.version}"
    # The program is read into memory by load_context, so the downloaded copy
    # can go (MLflow would otherwise leave one temp folder per load). MLflow's own
    # requirements check maps every installed distribution to its modules first
    # (1-3 s per process here); the same check on the model's pins is done here
    # directly, and still warns on a mismatch.
    with _MODEL_CODE_LOCK, tempfile.TemporaryDirectory(prefix="trainflow-load-") as dst:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst)
        verify_files(Path(local), model_name, mv, alias)
        model = mlflow.pyfunc.load_model(local, suppress_warnings=True)
        warn_requirement_mismatches(Path(local) / "requirements.txt", uri)
    cls = TextScorer if _scores_documents((model.metadata.metadata or {}).get(KIND_KEY)) else Predictor
    return cls(model, model_name, alias, str(mv.version), mv.run_id, uri)


def _scores_documents(task_name) -> bool:
    """Whether the task a model's metadata names (``KIND_KEY``) scores documents, not predictions
    (its pyfunc takes a text column: a ``TextScorer``). An unknown name: a plain ``Predictor``."""
    from core.errors import ConfigError
    from tasks import get_task

    if not isinstance(task_name, str):
        return False
    try:
        return get_task(task_name).evaluator == "documents"
    except ConfigError:
        return False
