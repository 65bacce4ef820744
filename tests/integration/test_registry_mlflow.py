"""The registry package against a real sqlite MLflow store in a temporary folder."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.waiting import wait_for

pytestmark = pytest.mark.integration

N_FEATURES = 64
FEATURES = [f"pixel_{i}" for i in range(N_FEATURES)]
LABELS = list(range(10))
MANIFEST_TAGS = {"git_sha": "0123abcd", "git_dirty": "false", "data_md5": "feed.dir", "seed": "0"}


@pytest.fixture(scope="module")
def store(mlflow_env):
    from registry.store import configure

    root = mlflow_env
    uri = f"sqlite:///{root / 'db' / 'mlflow.db'}"  # root is absolute: four slashes
    assert uri.startswith("sqlite:////")
    experiment_id = configure(uri, "trainflow-test", root / "artifacts")
    return {"root": root, "uri": uri, "experiment_id": experiment_id}


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """A small exported classifier with a dynamic batch, and the eager module it came from."""
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(N_FEATURES, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    ep = torch.export.export(
        module, (torch.zeros(2, N_FEATURES),),
        dynamic_shapes=({0: torch.export.Dim("batch", min=1)},),
    )
    path = tmp_path_factory.mktemp("program") / "model.pt2"
    torch.export.save(ep, str(path))
    return path, module


@pytest.fixture(scope="module")
def pixels():
    """40 rows of int64 pixel values 0..16, as read from the CSV."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    return pd.DataFrame(rng.integers(0, 17, size=(40, N_FEATURES)), columns=FEATURES)


def expected_labels(module, frame):
    import torch

    with torch.no_grad():
        return module(torch.tensor(frame.to_numpy(), dtype=torch.float32)).argmax(1).numpy()


def new_run(store, name="train"):
    from registry.store import start_run

    return start_run(store["experiment_id"], name, {"config_name": "test"})


def log_model_version(run_id, pt2, name, features, labels, example, tags, description=""):
    """Register a classifier program as the pipeline does: the classification task's spec
    (typed columns, class labels), its program check, then ``registry.models.log_version``."""
    from registry.models import log_version as log
    from tasks import get_task
    from tasks.base import ModelSpec
    from tasks.tabular import PYFUNC_CODE, PYFUNC_FILE

    task = get_task("classification")
    meta = {"format": "torch.export", "input_dtype": "float32", "feature_columns": list(features),
            "output": "label", "class_labels": list(labels)}
    spec = ModelSpec(PYFUNC_FILE, meta, [(c, "long") for c in features], [(None, "long")], example,
                     code_paths=PYFUNC_CODE)
    if Path(pt2).is_file():
        task.check_program(pt2, spec)
    return log(run_id, pt2, name, spec, tags, description)


def log_version(store, program, pixels, model_name, run_id=None, description=""):
    return log_model_version(
        run_id or new_run(store), program[0], model_name, FEATURES, LABELS, pixels,
        MANIFEST_TAGS, description,
    )


def test_configure_is_idempotent_and_places_artifacts_explicitly(store):
    from mlflow import MlflowClient

    from registry.store import configure

    root = store["root"]
    again = configure(store["uri"], "trainflow-test", root / "artifacts")
    assert again == store["experiment_id"]
    exp = MlflowClient().get_experiment(again)
    assert exp.artifact_location == f"{(root / 'artifacts').resolve().as_uri()}/trainflow-test"
    assert (root / "db" / "mlflow.db").is_file()


def test_limits_match_mlflow():
    from mlflow.utils import validation as v

    from registry import values

    assert values.MAX_KEY_LENGTH == v.MAX_ENTITY_KEY_LENGTH == v.MAX_MODEL_REGISTRY_TAG_KEY_LENGTH
    assert values.MAX_PARAM_VALUE_LENGTH == v.MAX_PARAM_VAL_LENGTH
    assert values.MAX_TAG_VALUE_LENGTH == v.MAX_TAG_VAL_LENGTH
    assert values.MAX_MODEL_TAG_VALUE_LENGTH == v.MAX_MODEL_REGISTRY_TAG_VALUE_LENGTH
    assert values.MAX_PARAMS_TAGS_PER_BATCH == v.MAX_PARAMS_TAGS_PER_BATCH
    assert values.MAX_METRICS_PER_BATCH == v.MAX_METRICS_PER_BATCH


def test_run_logging_round_trip(store, tmp_path):
    from mlflow import MlflowClient

    from registry.store import end_run, log_file, log_json, log_metrics, log_params

    run_id = new_run(store, "logging")
    params = {
        "training": {"lr": 0.002, "channels": [16, 32]},
        "long": "v" * 7000,
        "many": {f"p{i}": i for i in range(150)},  # more than one batch of 100
    }
    logged = log_params(run_id, params)
    log_params(run_id, params)  # same values again: accepted (a retried task)
    log_metrics(run_id, {"val": {"accuracy": 0.5, "loss": 1.25}}, step=3)
    log_json(run_id, {"a": [1, 2]}, "reports/gate.json")
    (tmp_path / "note.txt").write_text("hello")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "x.txt").write_text("x")
    log_file(run_id, tmp_path / "note.txt")
    log_file(run_id, tmp_path / "dir", "folder")
    end_run(run_id, "FINISHED")

    c = MlflowClient()
    run = c.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "logging"
    assert run.data.tags["config_name"] == "test"
    assert run.data.params["training.lr"] == "0.002"
    assert run.data.params["training.channels"] == "[16,32]"
    assert run.data.params["many.p149"] == "149"
    assert len(run.data.params["long"]) == 6000 == len(logged["long"])
    assert run.data.metrics == {"val.accuracy": 0.5, "val.loss": 1.25}
    assert c.get_metric_history(run_id, "val.loss")[0].step == 3
    paths = {a.path for a in c.list_artifacts(run_id)}
    assert {"reports", "note.txt", "folder"} <= paths
    local = c.download_artifacts(run_id, "reports/gate.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == {"a": [1, 2]}

    failed = new_run(store, "failing")
    end_run(failed, "FAILED")
    assert c.get_run(failed).info.status == "FAILED"
    with pytest.raises(ValueError):
        end_run(failed, "DONE")


def test_system_metrics_are_sampled_until_the_run_ends_and_stop_with_it(store):
    import threading

    from mlflow import MlflowClient

    from registry.store import end_run, system_metrics

    run_id = new_run(store, "monitored")
    monitor = system_metrics(run_id, interval_s=0.2)
    assert monitor is not None
    wait_for(lambda: MlflowClient().get_metric_history(run_id, "system/cpu_utilization_percentage"), 60,
             "the monitor's first sample of the run")
    end_run(run_id, "FAILED", "failed: train", monitor)  # a failed run stops it too
    assert not [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor"]
    run = MlflowClient().get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["trainflow.stage"] == "failed: train"
    history = MlflowClient().get_metric_history(run_id, "system/cpu_utilization_percentage")
    # Sampled from step 1: registration links a run's step-0 metrics to the model it logs.
    assert history and min(m.step for m in history) == 1
    assert "system/system_memory_usage_megabytes" in run.data.metrics


def test_empty_registry_has_no_champion_and_no_predictor(store):
    from registry.models import champion_version, load_predictor

    assert champion_version("never-registered") is None
    assert load_predictor("never-registered") is None
    assert load_predictor("never-registered", alias="challenger") is None


def test_version_lifecycle(store, program, pixels):
    import mlflow
    import numpy as np
    from mlflow import MlflowClient

    from registry.models import aliases_of, champion_version, load_predictor, pip_requirements, promote

    name = "digits-lifecycle"
    c = MlflowClient()
    run1 = new_run(store, "v1")

    t0 = time.perf_counter()
    v1 = log_model_version(run1, program[0], name, FEATURES, LABELS, pixels, MANIFEST_TAGS,
                           "first candidate")
    elapsed = time.perf_counter() - t0
    print(f"log_model_version: {elapsed:.2f} s")
    assert v1["name"] == name and v1["version"] == "1" and v1["run_id"] == run1
    assert v1["model_uri"] == f"models:/{name}/1"

    # Registered, tagged, described, aliased @challenger; no champion yet.
    mv = c.get_model_version(name, "1")
    assert mv.run_id == run1
    assert mv.description == "first candidate"
    assert {k: mv.tags[k] for k in MANIFEST_TAGS} == MANIFEST_TAGS
    assert aliases_of(name, "1") == ["challenger"]
    assert champion_version(name) is None
    assert load_predictor(name) is None

    # The logged model belongs to our experiment, is READY, has our pins (no
    # requirement inference) and its files sit under the artifact root.
    lm = c.get_logged_model(v1["model_id"])
    assert lm.experiment_id == store["experiment_id"]
    assert lm.source_run_id == run1
    assert str(lm.status).endswith("READY")
    assert lm.tags["git_sha"] == MANIFEST_TAGS["git_sha"]
    # It names the version made from it (the LoggedModel page's "Model versions"), once, also when a
    # retried registration of the same run and program reuses that version.
    again = log_model_version(run1, program[0], name, FEATURES, LABELS, pixels, MANIFEST_TAGS, "first candidate")
    assert again["reused"] and again["version"] == "1" and again["model_id"] == v1["model_id"]
    assert json.loads(c.get_logged_model(v1["model_id"]).tags["mlflow.modelVersions"]) == [{"name": name, "version": "1"}]
    model_dir = store["root"] / "artifacts" / "trainflow-test" / "models" / v1["model_id"] / "artifacts"
    assert (model_dir / "MLmodel").is_file()
    assert (model_dir / "artifacts" / "model.pt2").is_file()
    assert (model_dir / "pyfunc_table.py").is_file() and (model_dir / "code" / "pyfunc_common.py").is_file()
    assert (model_dir / "requirements.txt").read_text().split() == pip_requirements()
    assert (model_dir / "input_example.json").is_file()
    assert not (store["root"] / "cwd" / "mlruns").exists()

    # Signature: the 64 named columns in, as the data types them (long), long labels out.
    meta = mlflow.models.get_model_info(v1["model_uri"])
    assert meta.signature.inputs.input_names() == FEATURES
    assert {c.type.name for c in meta.signature.inputs.inputs} == {"long"}
    (out_spec,) = meta.signature.outputs.inputs
    assert out_spec.type.name == "long"

    promote(name, v1["version"])
    assert aliases_of(name, "1") == ["challenger", "champion"]
    champ = champion_version(name)
    assert champ["version"] == "1" and champ["run_id"] == run1
    assert {k: champ["tags"][k] for k in MANIFEST_TAGS} == MANIFEST_TAGS

    # Loading by alias predicts what the eager torch model predicts, for integer frames and
    # plain arrays; a float frame for integer columns is refused by the typed signature.
    expected = expected_labels(program[1], pixels)
    raw = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    for frame in (pixels, pixels.astype("int32")):
        out = raw.predict(frame)
        assert out.dtype == np.int64
        np.testing.assert_array_equal(out, expected)
    with pytest.raises(mlflow.exceptions.MlflowException, match="pixel_0"):
        raw.predict(pixels.astype("float64") + 0.5)
    np.testing.assert_array_equal(raw.predict(pixels.iloc[:1]), expected[:1])
    shuffled = pixels[list(reversed(FEATURES))]  # column order does not matter
    np.testing.assert_array_equal(raw.predict(shuffled), expected)

    predict = load_predictor(name)
    assert predict.version == "1" and predict.run_id == run1
    np.testing.assert_array_equal(predict(pixels), expected)
    np.testing.assert_array_equal(predict(pixels.to_numpy()), expected)
    np.testing.assert_array_equal(predict(pixels.to_numpy()[0]), expected[:1])

    # A second version without promotion takes @challenger only.
    run2 = new_run(store, "v2")
    v2 = log_model_version(run2, program[0], name, FEATURES, LABELS, pixels, MANIFEST_TAGS)
    assert v2["version"] == "2"
    assert aliases_of(name, "1") == ["champion"]
    assert aliases_of(name, "2") == ["challenger"]
    assert champion_version(name)["version"] == "1"
    assert load_predictor(name).version == "1"
    assert load_predictor(name, alias="challenger").version == "2"

    promote(name, "2")
    assert champion_version(name)["version"] == "2"
    assert aliases_of(name, "1") == []


def test_class_labels_map_logits_to_labels(store, program, pixels):
    import numpy as np

    from registry.models import load_predictor, promote

    name = "digits-relabelled"
    labels = [10 * i for i in LABELS]
    info = log_model_version(new_run(store), program[0], name, FEATURES, labels, pixels, {})
    promote(name, info["version"])
    expected = np.asarray(labels)[expected_labels(program[1], pixels)]
    np.testing.assert_array_equal(load_predictor(name)(pixels), expected)


def test_pyfunc_rejects_bad_input(store, program, pixels):
    import mlflow
    import numpy as np

    from registry.models import load_predictor, promote

    name = "digits-bad-input"
    info = log_model_version(new_run(store), program[0], name, FEATURES, LABELS, pixels, {})
    promote(name, info["version"])
    predict = load_predictor(name)
    with pytest.raises(mlflow.exceptions.MlflowException, match="pixel_3"):
        predict(pixels.drop(columns=["pixel_3"]))
    with pytest.raises(ValueError, match="infinite"):
        predict.pyfunc.unwrap_python_model().predict(None, pixels.astype("float64").where(pixels > 0, np.inf))


def test_log_model_version_checks_inputs_before_logging(store, program, pixels, tmp_path):
    from mlflow import MlflowClient

    name = "digits-never"
    run_id = new_run(store)
    with pytest.raises(ValueError, match=r"expected \[5, 3\]"):
        log_model_version(run_id, program[0], name, FEATURES, [0, 1, 2], pixels, {})
    with pytest.raises(ValueError, match="lacks feature columns"):
        log_model_version(run_id, program[0], name, FEATURES, LABELS, pixels[FEATURES[:10]], {})
    with pytest.raises(FileNotFoundError):
        log_model_version(run_id, tmp_path / "missing.pt2", name, FEATURES, LABELS, pixels, {})
    (tmp_path / "junk.pt2").write_bytes(b"not a program")
    with pytest.raises(ValueError, match="not a loadable torch.export program"):
        log_model_version(run_id, tmp_path / "junk.pt2", name, FEATURES, LABELS, pixels, {})
    assert MlflowClient().search_registered_models(filter_string=f"name = '{name}'") == []


def test_tasks_in_threads_log_and_load_concurrently(store, program, pixels):
    """Flow tasks run in threads: no shared active run, and the loaders' globals are guarded."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from registry.models import champion_version, load_predictor, promote
    from registry.store import end_run, log_metrics, start_run

    name = "digits-threads"
    expected = expected_labels(program[1], pixels)

    def task(i: int) -> tuple[str, str]:
        run_id = start_run(store["experiment_id"], f"thread-{i}", {"i": str(i)})
        log_metrics(run_id, {"i": i})
        info = log_model_version(run_id, program[0], name, FEATURES, LABELS, pixels, {"i": str(i)})
        promote(name, info["version"])
        np.testing.assert_array_equal(load_predictor(name)(pixels), expected)
        end_run(run_id, "FINISHED")
        return info["version"], run_id

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(task, range(3)))
    assert sorted(v for v, _ in results) == ["1", "2", "3"]
    assert len({r for _, r in results}) == 3
    champ = champion_version(name)
    assert (champ["version"], champ["run_id"]) in results


def test_registering_checks_the_pins_directly_where_mlflow_would_scan_every_distribution(caplog):
    """``registry.models._Pyfunc`` swaps MLflow's requirement check for one on the pins: the name it
    swaps must be the one ``mlflow.pyfunc.save_model``'s requirement processing calls (an MLflow
    upgrade that moves it fails here, not silently slow), and the swap still warns on a mismatch."""
    import importlib
    import logging

    from registry.models import _Pyfunc, _warn_mismatches

    module = importlib.import_module(_Pyfunc.CHECK[0])
    assert callable(getattr(module, _Pyfunc.CHECK[1]))
    assert _Pyfunc.CHECK[1] in module._process_pip_requirements.__code__.co_names
    with caplog.at_level(logging.WARNING, logger="registry.models"):
        _warn_mismatches(["numpy==0.0.1", "-c constraints.txt"])
    assert "numpy (current: " in caplog.text and "required: numpy==0.0.1" in caplog.text
