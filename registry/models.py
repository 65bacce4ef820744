"""Log, register, promote and load the classifier through the MLflow model registry.

The model is a pyfunc logged *from code* (``registry/pyfunc_model.py``) around
the ``torch.export`` program, so loading it needs mlflow, torch, pandas and
numpy but no project code and no pickle. Versions are addressed by alias only
(``@challenger`` for the newest registered version, ``@champion`` for the one
serving); registry stages are never used.

MLflow, torch, pandas and numpy are imported inside the functions.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from registry.store import client, is_already_exists, is_not_found
from registry.values import MAX_MODEL_TAG_VALUE_LENGTH, MAX_TAG_VALUE_LENGTH, clean_tags

CHALLENGER = "challenger"
CHAMPION = "champion"
ARTIFACT_NAME = "model"
PYFUNC_FILE = Path(__file__).with_name("pyfunc_model.py")
PYFUNC_LM_FILE = Path(__file__).with_name("pyfunc_lm.py")
# Model metadata key telling a loader what the pyfunc takes ("lm": a text column).
KIND_KEY = "trainflow_kind"
# Rows of the input example stored with the model (enough to document the shape).
MAX_EXAMPLE_ROWS = 5

# Two process-wide globals make logging and loading unsafe in parallel threads:
# MLflow's models-from-code loader hands the model back through
# mlflow.models.model.__mlflow_model__ (set by set_model() while the code file
# runs), and torch.export.load asserts on its own _CURRENT_DESERIALIZER
# ("_CURRENT_DESERIALIZER is already set"). Every log, load and program check
# here takes this lock.
_MODEL_CODE_LOCK = threading.RLock()


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


def _check_features(feature_columns: Sequence[str]) -> list[str]:
    features = [str(c) for c in feature_columns]
    if not features:
        raise ValueError("feature_columns is empty")
    if len(set(features)) != len(features):
        raise ValueError("feature_columns has duplicates")
    return features


def _check_labels(class_labels: Sequence[int]) -> list[int]:
    import numbers

    labels = list(class_labels)
    if not labels:
        raise ValueError("class_labels is empty")
    for label in labels:
        if isinstance(label, bool) or not isinstance(label, numbers.Integral):
            raise ValueError(f"class_labels must be integers, got {label!r}")
    labels = [int(x) for x in labels]
    if len(set(labels)) != len(labels):
        raise ValueError("class_labels has duplicates")
    return labels


def _example_frame(input_example, features: list[str]):
    """The first rows of ``input_example``'s feature columns, as float64."""
    import numpy as np
    import pandas as pd

    if not isinstance(input_example, pd.DataFrame):
        raise TypeError(f"input_example must be a pandas DataFrame, got {type(input_example).__name__}")
    missing = [c for c in features if c not in input_example.columns]
    if missing:
        raise ValueError(f"input_example lacks feature columns {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if input_example.empty:
        raise ValueError("input_example has no rows")
    try:
        example = input_example[features].head(MAX_EXAMPLE_ROWS).astype("float64")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"input_example feature columns are not numeric: {exc}") from None
    if not np.isfinite(example.to_numpy()).all():
        raise ValueError("input_example has NaN or infinite feature values")
    return example.reset_index(drop=True)


def _example_labels(model_pt2: Path, example, labels: list[int]):
    """Run the program on the example: it must give ``[rows, len(class_labels)]`` logits."""
    import numpy as np
    import torch

    try:
        with _MODEL_CODE_LOCK:
            program = torch.export.load(str(model_pt2)).module()
    except Exception as exc:
        raise ValueError(f"{model_pt2}: not a loadable torch.export program: {exc}") from exc
    x = torch.tensor(example.to_numpy(dtype=np.float32))
    with torch.inference_mode():
        logits = program(x)
    if logits.ndim != 2 or logits.shape[0] != len(example) or logits.shape[1] != len(labels):
        raise ValueError(
            f"{model_pt2}: maps [{len(example)}, {x.shape[1]}] inputs to {list(logits.shape)}, "
            f"expected [{len(example)}, {len(labels)}] logits (one per class label)"
        )
    return np.asarray(labels, dtype=np.int64)[logits.argmax(dim=1).numpy()]


def _signature(features: list[str]):
    """Named feature columns of any numeric type in; int64 labels out.

    The columns are typed ``Any`` rather than ``double``: MLflow's schema check
    refuses int64 columns for a ``double`` column (only int32 and smaller are
    "safe"), and pixel data read from CSV is int64. ``predict`` casts to float32
    itself and rejects non-numeric or non-finite values.
    """
    import numpy as np
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, Schema, TensorSpec

    return ModelSignature(
        inputs=Schema([ColSpec(AnyType(), name) for name in features]),
        outputs=Schema([TensorSpec(np.dtype("int64"), (-1,))]),
    )


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
    """

    __name__ = "mlflow.pyfunc"

    @staticmethod
    def save_model(*args, validate_serving_input: bool = True, **kwargs):
        import mlflow.pyfunc

        return mlflow.pyfunc.save_model(*args, **kwargs)


def _log_and_register(run_id: str, model_name: str, model_pt2: Path, meta: dict, python_model: Path,
                      signature, example, manifest_tags: Mapping[str, Any], description: str,
                      metadata: dict | None = None, validate_serving: bool = True) -> dict:
    """Log ``python_model`` (models-from-code over ``model_pt2`` + ``meta``) to ``run_id``, register
    it as a new version of ``model_name`` tagged with the manifest, and alias it ``@challenger``.

    ``validate_serving``: MLflow loads the logged model and predicts its input example (the
    serving check). False skips that when the caller has run the same program file already."""
    from mlflow.models import Model

    c = client()
    run = c.get_run(run_id)
    with tempfile.TemporaryDirectory(prefix="trainflow-model-") as tmp:
        meta_file = Path(tmp, "meta.json")
        meta_file.write_text(json.dumps(meta))
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
                artifacts={"model": str(model_pt2), "meta": str(meta_file)},
                pip_requirements=pip_requirements(),
                signature=signature,
                input_example=example,
                metadata=metadata,
                validate_serving_input=validate_serving,
            )

    _ensure_registered_model(c, model_name)
    version = c.create_model_version(
        name=model_name,
        source=f"models:/{logged.model_id}",
        run_id=run_id,
        tags=clean_tags(manifest_tags, MAX_MODEL_TAG_VALUE_LENGTH),
        description=description or None,
        model_id=logged.model_id,
    )
    c.set_registered_model_alias(model_name, CHALLENGER, str(version.version))
    return {
        "name": model_name,
        "version": str(version.version),
        "model_uri": f"models:/{model_name}/{version.version}",
        "run_id": run_id,
        "model_id": logged.model_id,
    }


def log_model_version(
    run_id: str,
    model_pt2: Path,
    model_name: str,
    feature_columns: list[str],
    class_labels: list[int],
    input_example,
    manifest_tags: Mapping[str, Any],
    description: str = "",
    program_outputs: int | None = None,
) -> dict:
    """Log the program as a pyfunc model of ``run_id``, register it, tag it, alias it ``@challenger``.

    The program is run on the example first: it must give one logit per class label. A caller
    that has just run this very file on whole splits (the training worker's scoring) passes the
    logits per row it saw as ``program_outputs``; when that equals the label count the check
    holds already, and the program is not loaded here, neither by this check nor by MLflow's
    serving check of the logged model (no torch import in this process).

    Returns ``{"name", "version", "model_uri", "run_id", "model_id"}`` where
    ``model_uri`` is ``models:/<name>/<version>``.
    """
    model_pt2 = Path(model_pt2)
    if not model_pt2.is_file():
        raise FileNotFoundError(f"model program not found: {model_pt2}")
    features = _check_features(feature_columns)
    labels = _check_labels(class_labels)
    example = _example_frame(input_example, features)
    checked = program_outputs == len(labels)
    if not checked:
        _example_labels(model_pt2, example, labels)

    meta = {"format": "torch.export", "input_dtype": "float32", "feature_columns": features, "class_labels": labels}
    return _log_and_register(run_id, model_name, model_pt2, meta, PYFUNC_FILE, _signature(features), example,
                             manifest_tags, description,
                             validate_serving=not checked)


def promote(model_name: str, version: str, alias: str = CHAMPION) -> None:
    """Point ``@alias`` at ``version`` (moving it off whichever version had it)."""
    client().set_registered_model_alias(model_name, alias, str(version))


def promote_if(model_name: str, version: str, still_deserves: Callable[[dict | None], tuple[bool, str]],
               lock_path: Path, alias: str = CHAMPION, timeout_s: float = 300.0) -> dict:
    """Move ``@alias`` to ``version`` only if it beats the holder *at promotion time*.

    MLflow has no compare-and-set on aliases, so read-decide-set runs under an exclusive file
    lock (``lock_path``: beside the sqlite database for the embedded store, else a file every
    promoter on the host or shared filesystem sees). ``still_deserves(current)`` gets the
    current holder as ``champion_version`` returns it (None when there is none) and answers
    ``(promote?, reason)``. After setting, the alias is read back; a writer that bypasses the
    lock (another tool, another host without the shared lock file) can still interleave: that
    shows up as ``confirmed: false``.

    Returns ``{"promoted", "reason", "previous", "champion", "confirmed"}``.
    """
    from core.locks import exclusive

    with exclusive(lock_path, timeout_s=timeout_s):
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
    """A loaded registry model: ``predictor(features) -> int64 labels``.

    ``features`` is a DataFrame holding the feature columns (int or float), or a
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
        return np.asarray(self.pyfunc.predict(features), dtype=np.int64)

    def __repr__(self) -> str:
        return f"Predictor({self.name}@{self.alias} = version {self.version})"


def _lm_signature():
    from mlflow.models.signature import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "text")]),
        outputs=Schema([ColSpec("double", "loss"), ColSpec("double", "perplexity"), ColSpec("long", "n_tokens")]),
    )


def log_lm_version(
    run_id: str,
    model_pt2: Path,
    model_name: str,
    seq_len: int,
    input_example,
    manifest_tags: Mapping[str, Any],
    description: str = "",
) -> dict:
    """Log a byte-level LM program as a text-scoring pyfunc (``registry/pyfunc_lm.py``), register
    it, tag it, alias it ``@challenger``. ``input_example``: a DataFrame with a ``text`` column.

    Returns the same dict as :func:`log_model_version`.
    """
    import pandas as pd
    import torch

    model_pt2 = Path(model_pt2)
    if not model_pt2.is_file():
        raise FileNotFoundError(f"model program not found: {model_pt2}")
    if not isinstance(input_example, pd.DataFrame) or "text" not in input_example.columns or input_example.empty:
        raise ValueError("input_example must be a non-empty DataFrame with a 'text' column")
    example = input_example[["text"]].head(MAX_EXAMPLE_ROWS).reset_index(drop=True)
    try:
        with _MODEL_CODE_LOCK:
            program = torch.export.load(str(model_pt2)).module()
    except Exception as exc:
        raise ValueError(f"{model_pt2}: not a loadable torch.export program: {exc}") from exc
    with torch.inference_mode():
        logits = program(torch.zeros((1, seq_len), dtype=torch.int64))
    if tuple(logits.shape) != (1, seq_len, 256):
        raise ValueError(f"{model_pt2}: maps [1, {seq_len}] tokens to {list(logits.shape)}, "
                         f"expected [1, {seq_len}, 256] byte logits")

    meta = {"format": "torch.export", "input_dtype": "int64", "seq_len": int(seq_len), "vocab": "utf-8 bytes"}
    return _log_and_register(run_id, model_name, model_pt2, meta, PYFUNC_LM_FILE, _lm_signature(), example,
                             manifest_tags, description, metadata={KIND_KEY: "lm"})


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

    A language model (logged by :func:`log_lm_version`) loads as a :class:`TextScorer`.

    The alias is resolved once and that version loaded, so ``.version`` names
    exactly what predicts even if the alias moves meanwhile.
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
        model = mlflow.pyfunc.load_model(uri, dst_path=dst, suppress_warnings=True)
        warn_requirement_mismatches(Path(dst) / "requirements.txt", uri)
    if (model.metadata.metadata or {}).get(KIND_KEY) == "lm":
        return TextScorer(model, model_name, alias, str(mv.version), mv.run_id, uri)
    return Predictor(model, model_name, alias, str(mv.version), mv.run_id, uri)
