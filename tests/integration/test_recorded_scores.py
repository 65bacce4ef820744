"""The champion's recorded test scores stand in for rescoring it only when they are the same
computation: real sqlite MLflow registry, real registered versions, the pipeline's own
evaluate / log functions and evaluation.champion.deserves on the bundled digits test split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.integration

N_FEATURES = 64


@pytest.fixture(scope="module")
def mlflow_store(mlflow_env):
    """A real sqlite MLflow store in ``mlflow_env``'s folder (telemetry off, undone afterwards)."""
    from registry.store import configure

    uri = f"sqlite:///{mlflow_env / 'mlflow.db'}"
    return {"root": mlflow_env, "uri": uri, "experiment_id": configure(uri, "recorded-test", mlflow_env / "artifacts")}


@pytest.fixture(scope="module")
def programs(bundled_data, tmp_path_factory):
    """Two exported classifiers of different quality (a few full-batch steps vs many), fit on the
    bundled training split so the confusion matrices and metrics mean something."""
    import torch

    import pandas as pd

    from training.export import export_model

    class Scale(torch.nn.Module):
        def forward(self, x):
            return x / 16

    train = pd.read_csv(bundled_data / "train.csv")
    xt = torch.tensor(train.drop(columns=["label"]).to_numpy(dtype=np.float32)) / 16
    yt = torch.tensor(train["label"].to_numpy())
    out = {}
    folder = tmp_path_factory.mktemp("programs")
    for name, steps in (("weak", 3), ("strong", 150)):
        torch.manual_seed(0)
        lin = torch.nn.Linear(N_FEATURES, 10)
        opt = torch.optim.Adam(lin.parameters(), lr=0.05)
        for _ in range(steps):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(lin(xt), yt).backward()
            opt.step()
        module = torch.nn.Sequential(Scale(), lin)
        (folder / name).mkdir()  # a training folder of its own: <folder>/model.pt2, as the worker writes
        out[name] = export_model(module, N_FEATURES, folder / name / "model.pt2")
    return out


def make_ctx(store, project: Path, model_name: str, tmp_path: Path):
    from core.config import load_config
    from core.manifest import DataRef, ImageRef, Manifest, World
    from flows.pipeline import RunContext
    from registry.store import start_run
    from tasks import get_task

    cfg = load_config(project / "configs" / "digits.yaml", [f"registry.model_name={model_name}"])
    manifest = Manifest("0" * 40, False, cfg.name, cfg.config_id(), DataRef("data/digits.dvc", "feed.dir", "HEAD"),
                        ImageRef(), "0" * 64, 0, World(1, 2, "gloo"))
    run_id = start_run(store["experiment_id"], "recorded", {"config_name": cfg.name})
    out = tmp_path / run_id
    out.mkdir(parents=True)
    from training.plan import HostFacts, plan_launch

    return RunContext(cfg, get_task(cfg.task), project, store["root"], store["uri"], run_id, manifest, out,
                      plan_launch(cfg, HostFacts(), 2))


@pytest.fixture
def project(repo_root, bundled_data, tmp_path):
    """A folder laid out like the repository: the digits config and a copy of the digits splits."""
    (tmp_path / "proj" / "configs").mkdir(parents=True)
    shutil.copy(repo_root / "configs" / "digits.yaml", tmp_path / "proj" / "configs")
    shutil.copy(repo_root / "configs" / "digits.expectations.yaml", tmp_path / "proj" / "configs")
    shutil.copytree(bundled_data, tmp_path / "proj" / "data" / "digits",
                    ignore=shutil.ignore_patterns("*.dvc", ".gitignore"))
    return tmp_path / "proj"


def evaluate_and_register(store, project, name, program: Path, tmp_path, promote=True):
    """What the pipeline does for one candidate: evaluate, log + register (recording its scores),
    promote. Returns (report, registration)."""
    from flows.pipeline import evaluate, log_version
    from registry import models

    ctx = make_ctx(store, project, name, tmp_path)
    result = {"out_dir": str(program.parent), "model_pt2": program.name, "weights_sha256": "0" * 64}
    report = evaluate.fn(ctx, result)
    reg = log_version(ctx, result, report)
    if promote:
        models.promote(name, reg["version"])
    return ctx, report, reg


def champion_rescored(name, project):
    """The champion loaded through the registry and scored here, as the pipeline did before."""
    from core.config import load_config
    from evaluation.evaluate import score_champion
    from registry import models
    from tasks import get_task

    cfg = load_config(project / "configs" / "digits.yaml")
    return score_champion(get_task(cfg.task), cfg, project, models.load_predictor(name, "champion"))


def test_recorded_champion_scores_equal_rescoring_and_are_used(mlflow_store, project, programs, tmp_path):
    from flows.pipeline import evaluate
    from registry import models

    name = "rec-same"
    _, first, reg1 = evaluate_and_register(mlflow_store, project, name, programs["weak"], tmp_path)
    assert first["champion"] is None and first["champion_scores"] is None
    tags = models.champion_version(name)["tags"]
    assert json.loads(tags["eval_metrics"]) == {k: v for k, v in first["candidate"].items() if k != "latency_p95_ms"}
    # The evaluation's test metrics are linked to the registered LoggedModel (MLflow links the run's
    # metrics at the model's step, 0), so its page and the version's show them.
    from registry.store import client as mlflow_client

    linked = {m.key: m.value for m in mlflow_client().get_logged_model(reg1["model_id"]).metrics}
    names = ("accuracy", "macro_f1", "min_class_recall", "latency_p95_ms")
    assert {k: linked.get(f"test/{k}") for k in names} == pytest.approx({k: first["candidate"][k] for k in names})

    ctx = make_ctx(mlflow_store, project, name, tmp_path)
    report = evaluate.fn(ctx, {"out_dir": str(programs["strong"].parent), "model_pt2": programs["strong"].name})
    assert report["champion_scores"] == "recorded" and report["champion_version"] == reg1["version"]
    rescored = champion_rescored(name, project)
    assert report["champion"] == rescored  # the same numbers, to the last bit
    assert 0.3 < rescored["accuracy"] < report["candidate"]["accuracy"]  # the weak model is scored, not a copy
    from registry.store import client

    assert client().get_run(ctx.run_id).data.tags["trainflow.champion_scores"] == "recorded"
    written = json.loads((ctx.out_dir / "evaluation" / "metrics.json").read_text())
    assert written["champion_scores"] == "recorded" and written["champion"] == rescored


def test_a_changed_test_split_or_metric_code_rescoring_the_champion(mlflow_store, project, programs, tmp_path,
                                                                   monkeypatch):
    import pandas as pd

    from flows.pipeline import evaluate
    from tasks import get_task

    name = "rec-changed"
    evaluate_and_register(mlflow_store, project, name, programs["weak"], tmp_path)
    result = {"out_dir": str(programs["strong"].parent), "model_pt2": programs["strong"].name}

    task = type(get_task("classification"))
    monkeypatch.setattr(task, "metrics_version", task.metrics_version + 1)
    bumped = evaluate.fn(make_ctx(mlflow_store, project, name, tmp_path), result)
    assert bumped["champion_scores"] == "rescored"
    monkeypatch.undo()

    test_csv = project / "data" / "digits" / "test.csv"
    before = evaluate.fn(make_ctx(mlflow_store, project, name, tmp_path), result)
    assert before["champion_scores"] == "recorded"
    assert bumped["champion"] == before["champion"]  # rescoring gives what was recorded
    frame = pd.read_csv(test_csv)
    frame.iloc[: len(frame) - 40].to_csv(test_csv, index=False)  # 40 fewer test rows
    after = evaluate.fn(make_ctx(mlflow_store, project, name, tmp_path), result)
    assert after["champion_scores"] == "rescored"
    assert after["champion"] == champion_rescored(name, project)
    assert after["champion"]["n"] == before["champion"]["n"] - 40


def test_a_champion_without_recorded_scores_is_rescored(mlflow_store, project, programs, tmp_path):
    """A version registered before scores were recorded (no eval_* tags) is loaded and scored."""
    import pandas as pd

    from flows.pipeline import evaluate
    from registry import models
    from registry.store import start_run

    name = "rec-old"
    from tasks.base import ModelSpec
    from tasks.tabular import PYFUNC_CODE, PYFUNC_FILE

    x = pd.read_csv(project / "data" / "digits" / "test.csv").drop(columns=["label"]).head(5)
    meta = {"format": "torch.export", "input_dtype": "float32", "feature_columns": list(x.columns),
            "output": "label", "class_labels": list(range(10))}
    spec = ModelSpec(PYFUNC_FILE, meta, [(c, "long") for c in x.columns], [(None, "long")], x, code_paths=PYFUNC_CODE)
    reg = models.log_version(start_run(mlflow_store["experiment_id"], "old", {}), programs["weak"], name, spec,
                             {"data_md5": "feed.dir"})
    models.promote(name, reg["version"])
    report = evaluate.fn(make_ctx(mlflow_store, project, name, tmp_path),
                         {"out_dir": str(programs["strong"].parent), "model_pt2": programs["strong"].name})
    assert report["champion_scores"] == "rescored" and report["champion_version"] == reg["version"]
    assert report["champion"] == champion_rescored(name, project)


def test_deserves_uses_a_moved_champions_recorded_scores_or_rescores_it(mlflow_store, project, programs,
                                                                       tmp_path):
    """Under the promotion lock the champion may have moved since evaluation: the new one's recorded
    scores decide when they hold for this split, and it is rescored when they do not."""
    from evaluation.champion import deserves
    from evaluation.gates import beats
    from flows.pipeline import evaluate
    from registry import models
    from registry.store import client

    def _deserves(ctx, report, current):
        return deserves(ctx.task, ctx.cfg, ctx.root, report, current,
                        lambda: models.load_predictor(ctx.cfg.registry.model_name, "champion"))

    name = "rec-moved"
    evaluate_and_register(mlflow_store, project, name, programs["weak"], tmp_path)
    ctx = make_ctx(mlflow_store, project, name, tmp_path)
    report = evaluate.fn(ctx, {"out_dir": str(programs["weak"].parent), "model_pt2": programs["weak"].name})
    # Meanwhile another run registers the strong model and promotes it.
    _, _, reg2 = evaluate_and_register(mlflow_store, project, name, programs["strong"], tmp_path)
    current = models.champion_version(name)
    assert current["version"] == reg2["version"] != report["champion_version"]

    ok, reason = _deserves(ctx, report, current)
    assert "its recorded scores" in reason and not ok
    assert (ok, reason.split("; ", 1)[1]) == beats(ctx.task, report["candidate"], champion_rescored(name, project))

    client().delete_model_version_tag(name, reg2["version"], "eval_key")
    stale = models.champion_version(name)
    ok2, reason2 = _deserves(ctx, report, stale)
    assert "(rescored)" in reason2 and (ok2, reason2.split("; ", 1)[1]) == (ok, reason.split("; ", 1)[1])
