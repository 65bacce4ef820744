"""The example package examples/trainflow-timeseries brings its own task through the entry-point
group ``trainflow.tasks``: installed into this environment (pip, editable), found by name,
trained by the real worker under torchrun, scored against its own baseline with its own
metrics, gated, and registered into a real sqlite MLflow store whose pyfunc predicts from a
DataFrame of the named window columns.

The full flow (``trainflow run`` on the example's config, in a fresh git + DVC project) runs
once (``flow_run``): its training folder is the one the worker, evaluation and registry tests
look at.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "trainflow-timeseries"
CONFIG = EXAMPLE / "configs" / "timeseries.yaml"
TASK = "sequence-forecast"
# Small, bounded jobs: a hung one fails the test in minutes.
BOUNDS = ["training.timeout_s=180", "training.collective_timeout_s=60"]
MANIFEST_TAGS = {"git_sha": "0123abcd", "git_dirty": "false", "data_md5": "x", "seed": "0"}


def _installed_here() -> bool:
    """The entry point is listed and the package imports from this checkout's example folder
    (not from another checkout that installed it into the same environment)."""
    import importlib.util
    from importlib.metadata import entry_points

    if TASK not in {ep.name for ep in entry_points(group="trainflow.tasks")}:
        return False
    spec = importlib.util.find_spec("trainflow_timeseries")
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().is_relative_to(EXAMPLE)


def _activate_editable_finder() -> None:
    """Run the new distribution's ``.pth`` in this process (Python runs .pth files at start-up
    only): setuptools' editable finder then maps ``trainflow_timeseries`` to the example folder."""
    import importlib
    import site

    for folder in site.getsitepackages():
        for pth in Path(folder).glob("__editable__.trainflow_timeseries-*.pth"):
            for line in pth.read_text().splitlines():
                if line.startswith("import "):
                    exec(line)  # noqa: S102 - what site.addpackage does for an import line
    importlib.invalidate_caches()


def install_example() -> None:
    """``pip install -e examples/trainflow-timeseries`` into this environment, once (a no-op when
    this checkout's copy is installed already). No network: no build isolation, no dependencies.
    A file lock in the environment keeps two test processes (pytest-xdist) from installing at once."""
    from filelock import FileLock

    with FileLock(str(Path(sys.prefix) / ".trainflow-example-install.lock")):
        if not _installed_here():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                            "-e", str(EXAMPLE)], check=True, capture_output=True, text=True, timeout=300)
    if not _installed_here():  # installed after this process started (by it or by another)
        _activate_editable_finder()
    assert _installed_here()


@pytest.fixture(scope="module")
def installed():
    install_example()


@pytest.fixture(scope="module")
def root(installed, tmp_path_factory) -> Path:
    """A project root holding the generated data and the reviewed expectations at the config's paths."""
    from core.config import load_config
    from trainflow_timeseries.data import generate

    cfg = load_config(CONFIG)
    root = tmp_path_factory.mktemp("tsroot")
    generate(root / cfg.dataset.path)
    exp = root / cfg.dataset.expectations_file
    exp.parent.mkdir(parents=True)
    shutil.copy(ROOT / cfg.dataset.expectations_file, exp)
    return root


def cfg_of(*overrides: str):
    from core.config import load_config

    return load_config(CONFIG, [*BOUNDS, *overrides])


def worker(root: Path, out: Path, overrides=(), nproc: int = 2, timeout: float = 300) -> dict:
    """Train with the real worker (torchrun for nproc > 1), rank 0 scoring the program on the test
    split as the pipeline asks it to; returns result.json."""
    args = ["-m", "training.worker", "--config", str(CONFIG), "--out", str(out), "--root", str(root),
            "--data-md5", "x"]
    for item in [*BOUNDS, *overrides]:
        args += ["--set", item]
    cmd = [sys.executable, *(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
                             if nproc > 1 else []), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINFLOW_SCORE_TEST": "1"}
    # start_new_session: a timed-out job is killed as a group (torchrun and its workers).
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        raise AssertionError(f"training timed out after {timeout} s:\n{log[-4000:]}") from None
    assert proc.returncode == 0, log[-4000:]
    return json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def flow_run(prefect_api, root, tmp_path_factory) -> tuple[int, dict, str]:
    """``trainflow run`` on the example's config in a fresh git + DVC project holding the
    generated data (the same bytes as ``root``'s: the generator is deterministic) and the
    reviewed expectations: (exit code, summary, stderr). Its training, the example config
    trained with ddp over 2 torchrun processes (CPU, gloo), is the one ``trained`` looks at."""
    from core.config import load_config
    from tests.integration.conftest import DVC_BIN, run
    from tests.integration.test_bring_your_own import BOUNDS as RUN_BOUNDS
    from tests.integration.test_bring_your_own import commit_all, trainflow

    cfg = load_config(CONFIG)
    proj = tmp_path_factory.mktemp("ts-project") / "proj"
    proj.mkdir()
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    (proj / ".gitignore").write_text(".trainflow/\n")
    shutil.copytree(root / cfg.dataset.path, proj / cfg.dataset.path)
    run([DVC_BIN, "add", "-q", cfg.dataset.path], proj)
    rel = CONFIG.relative_to(ROOT)
    (proj / rel.parent).mkdir(parents=True)
    shutil.copy(CONFIG, proj / rel)
    shutil.copy(ROOT / cfg.dataset.expectations_file, proj / cfg.dataset.expectations_file)
    commit_all(proj, "timeseries")
    return trainflow(proj, "run", "--config", str(rel), "--set", "training.epochs=10", *RUN_BOUNDS)


@pytest.fixture(scope="module")
def trained(flow_run) -> tuple[Path, dict]:
    """The training folder of ``flow_run`` and its result.json (the real worker under torchrun,
    rank 0 scoring the program on the test split as the pipeline asks it to)."""
    code, s, err = flow_run
    assert code == 0, (s.get("error"), err[-3000:])
    out = Path(s["train_dir"])
    return out, json.loads((out / "result.json").read_text())


@pytest.fixture(scope="module")
def evaluated(trained, root, tmp_path_factory) -> dict:
    from evaluation.evaluate import evaluate
    from tasks import task_for

    cfg = cfg_of()
    return evaluate(task_for(cfg), cfg, root, trained[0], tmp_path_factory.mktemp("ts-eval"))


def test_task_resolves_through_the_entry_point(installed):
    from importlib.metadata import entry_points

    from tasks import BUILTIN, get_task
    from tasks.base import Task

    assert TASK not in BUILTIN
    (ep,) = [ep for ep in entry_points(group="trainflow.tasks") if ep.name == TASK]
    assert ep.value == "trainflow_timeseries.task:SequenceForecast"
    task = get_task(TASK)
    assert isinstance(task, Task) and type(task).__module__ == "trainflow_timeseries.task"
    # A plain Task, not a table task's subclass, with its own evaluator; its plan names its own suite.
    assert type(task).__bases__ == (Task,) and task.evaluator().__name__ == "trainflow_timeseries.evaluate"
    assert {m.name: m.higher_is_better for m in task.metrics}["smape"] is False
    assert task.metric("directional_accuracy").higher_is_better
    assert task.primary == "smape" and task.champion_metrics == ("smape", "directional_accuracy")


def test_generator_is_deterministic_and_splits_by_time(installed, tmp_path):
    import pandas as pd

    from trainflow_timeseries.data import generate, window_columns

    a, b = generate(tmp_path / "a"), generate(tmp_path / "b")
    for split in ("train", "test"):
        assert a[split].read_bytes() == b[split].read_bytes()
    assert generate(tmp_path / "c", seed=1)["train"].read_bytes() != a["train"].read_bytes()
    train, test = pd.read_csv(a["train"]), pd.read_csv(a["test"])
    assert list(train.columns) == [*window_columns(), "y"] and list(test.columns) == list(train.columns)
    assert len(train) > 3 * len(test) > 0 and (train.to_numpy() > 0).all()
    # A window of step t+1 starts with the window of step t shifted by one: the test rows, later
    # in time, never reappear in train as a row.
    rows = lambda df: set(map(tuple, df.to_numpy().round(4)))  # noqa: E731
    assert not rows(train) & rows(test)


def test_config_fits_the_task_and_wrong_keys_name_themselves(installed):
    import yaml

    from core.config import config_from_dict
    from core.errors import ConfigError
    from tasks import task_for

    assert task_for(cfg_of()).name == TASK
    for override, key in [("model.kind=mlp", "model.kind"), ("model.kwargs={width: 3}", "model.kwargs.width"),
                          ("gates.thresholds={r2: 0.5}", "gates.thresholds.r2"),
                          ("training.early_stopping.metric=val_accuracy", "training.early_stopping.metric")]:
        with pytest.raises(ConfigError, match=rf"^{re.escape(key)}:"):
            task_for(cfg_of(override))
    # One file split by a seeded shuffle would leak overlapping windows into the test split.
    data = yaml.safe_load(CONFIG.read_text())
    for k in ("train_file", "test_file"):
        del data["dataset"][k]
    data["dataset"]["file"] = "all.csv"
    with pytest.raises(ConfigError, match=r"^dataset\.file: a time series is split by time"):
        task_for(config_from_dict(data))


def test_data_model_and_validation_plan_of_the_task(root):
    import torch

    from tasks import task_for
    from tasks.base import ValidationPlan

    cfg = cfg_of()
    task = task_for(cfg)
    splits = task.load_data(cfg, root, cfg.seed)
    info = splits.info
    assert info.features == [f"t{i}" for i in range(24)]
    x, y = splits.train.tensors
    vx, _ = splits.val.tensors
    assert x.dtype == torch.float32 and y.dtype == torch.float32 and x.shape[1] == 24
    # val is the train file's last rows (its most recent windows), raw targets (no scaling).
    frame = task.frames(cfg, root)["train"]
    assert torch.equal(vx, torch.tensor(frame[info.features].to_numpy()[-len(vx):], dtype=torch.float32))
    assert abs(float(y.mean()) - frame["y"].iloc[: len(y)].mean()) < 1e-3
    model = task.build_model(cfg, info)
    assert type(model).__name__ == "WindowNorm" and type(model.net).__name__ == "ConvForecaster"
    assert model(task.example_input(cfg, info, batch=3)).shape == (3, 1)
    plan = task.validation_plan(cfg, root)
    assert isinstance(plan, ValidationPlan) and plan.suite == "trainflow_timeseries.suite"
    assert [p.name for p in plan.files] == ["train.csv", "test.csv", "timeseries.expectations.yaml"]
    assert plan.params["label"] == "y" and plan.params["class_label"] is False


def test_validation_plan_runs_on_the_table_suite(root, tmp_path):
    """The task's plan through trainflow's table runner (GX), clean data and a broken copy."""
    import pandas as pd

    from tasks import task_for
    from validation.gx_run import run_plan

    cfg = cfg_of()
    task = task_for(cfg)
    assert run_plan(task.validation_plan(cfg, root), tmp_path / "ok")["success"]
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    train = pd.read_csv(bad / cfg.dataset.path / "train.csv")
    train.loc[3, "t5"] = -7.0  # a load below the reviewed minimum of 0
    train.to_csv(bad / cfg.dataset.path / "train.csv", index=False)
    report = run_plan(task.validation_plan(cfg, bad), tmp_path / "bad-report")
    assert not report["success"] and "t5" in json.dumps(report["failures"])


def test_torchrun_training_beats_the_persistence_baseline(trained, evaluated):
    out, result = trained
    assert result["status"] == "completed" and result["world_size"] == 2 and result["strategy"] == "ddp"
    assert (out / "model.pt2").is_file() and (out / "test_scores.json").is_file()
    cand, base = evaluated["candidate"], evaluated["baseline"]
    print(f"\ncandidate {json.dumps({k: round(v, 4) for k, v in cand.items()})}"
          f"\nbaseline  {json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in base.items()})}")
    assert evaluated["candidate_scored_in"] == "worker"  # the program, scored by rank 0, on the test split
    assert base["predictor"].startswith("persistence")
    assert cand["n"] == base["n"] == 480
    assert cand["smape"] < base["smape"] - 0.3
    assert cand["rmse"] < base["rmse"] and cand["mae"] < base["mae"]
    assert base["directional_accuracy"] == 0.0 and cand["directional_accuracy"] > 0.65
    # The package's evaluator ran: its own figure is in the report.
    assert evaluated["skill_vs_persistence"] == pytest.approx(1 - cand["rmse"] / base["rmse"])


def test_pipeline_scores_the_program_as_the_worker_did(trained, root, evaluated, tmp_path):
    """Without the worker's scores, the evaluator loads model.pt2 itself: the same figures."""
    from evaluation.evaluate import evaluate
    from tasks import task_for

    out = tmp_path / "train"
    shutil.copytree(trained[0], out, ignore=shutil.ignore_patterns("checkpoints", "test_scores.json"))
    cfg = cfg_of()
    report = evaluate(task_for(cfg), cfg, root, out, tmp_path / "eval")
    assert report["candidate_scored_in"] == "pipeline"
    for name in ("smape", "directional_accuracy", "rmse", "mae"):
        assert report["candidate"][name] == pytest.approx(evaluated["candidate"][name], rel=1e-6, abs=1e-9)


def test_gates_and_champion_rule_follow_the_tasks_directions(evaluated):
    from evaluation.gates import beats, decide
    from tasks import task_for

    cfg = cfg_of()
    task = task_for(cfg)
    cand, base = evaluated["candidate"], evaluated["baseline"]
    decision = decide(task, cand, cfg.gates, baseline=base)
    assert decision.passed, decision.reasons()
    ops = {c.name: c.op for c in decision.checks}
    assert ops == {"smape": "<=", "directional_accuracy": ">=", "latency_p95_ms": "<=", "smape_vs_baseline": "<="}
    # A champion 10 % better in smape: beyond max_regression (2 %, relative) -> the gate lists it.
    better = {**cand, "smape": cand["smape"] * 0.9, "directional_accuracy": cand["directional_accuracy"] + 0.1}
    decision = decide(task, cand, cfg.gates, champion=better, champion_version="3", baseline=base)
    assert not decision.passed
    assert [c.name for c in decision.failures] == ["smape_vs_champion", "directional_accuracy_vs_champion"]
    # Within 1 % of the champion's smape: the gate lets it through, but it does not take @champion.
    close = {**cand, "smape": cand["smape"] * 0.99}
    assert decide(task, cand, cfg.gates, champion=close, champion_version="3", baseline=base).passed
    assert not beats(task, cand, close)[0]
    assert beats(task, cand, {**cand, "smape": cand["smape"] * 1.01})[0]
    assert beats(task, cand, base)[0]


def test_model_factory_names_another_network(root, tmp_path):
    """``model.factory`` picks the package's GRU instead of the default conv net; one process."""
    import torch

    from tasks import task_for

    overrides = ["model.factory=trainflow_timeseries.model:gru_forecaster", "model.kwargs={hidden: 8}",
                 "training.strategy=single", "training.cpu_workers=1", "training.epochs=2"]
    result = worker(root, tmp_path, overrides, nproc=1)
    assert result["status"] == "completed"
    cfg = cfg_of(*overrides)
    task = task_for(cfg)
    _, x, _, info = task.eval_data(cfg, root)
    model = task.build_model(cfg, info)
    assert type(model.net).__name__ == "GRUForecaster"
    model.load_state_dict(torch.load(tmp_path / "weights.pt"))
    program = torch.export.load(str(tmp_path / "model.pt2")).module()
    with torch.no_grad():
        assert torch.allclose(program(torch.as_tensor(x[:9])), model.eval()(torch.as_tensor(x[:9])), atol=1e-5)


@pytest.fixture(scope="module")
def store(mlflow_env):
    from registry.store import configure

    uri = f"sqlite:///{mlflow_env / 'db' / 'mlflow.db'}"
    return {"uri": uri, "experiment_id": configure(uri, "trainflow-timeseries-test", mlflow_env / "artifacts")}


def test_registered_model_predicts_from_named_columns(store, trained, root, evaluated):
    import mlflow.pyfunc
    import numpy as np
    import torch

    from registry.models import CHALLENGER, log_version
    from registry.store import start_run
    from tasks import task_for

    cfg = cfg_of()
    task = task_for(cfg)
    out = trained[0]
    spec = task.model_spec(cfg, root, out, evaluated)
    assert spec.meta["output"] == "value" and spec.meta["feature_columns"] == [f"t{i}" for i in range(24)]
    assert spec.inputs == [(f"t{i}", "double") for i in range(24)] and spec.outputs == [(None, "double")]
    task.check_program(out / "model.pt2", spec)
    run_id = start_run(store["experiment_id"], "train", {"config_name": cfg.name})
    version = log_version(run_id, out / "model.pt2", cfg.registry.model_name, spec, MANIFEST_TAGS,
                          description=task.describe(cfg, evaluated["candidate"]))
    assert version["version"] == "1"
    model = mlflow.pyfunc.load_model(f"models:/{cfg.registry.model_name}@{CHALLENGER}")
    frame, x, y, info = task.eval_data(cfg, root)
    # The columns by name: reversed order and an extra column change nothing.
    shuffled = frame[list(reversed(info.features))].assign(note="ignored")
    pred = np.asarray(model.predict(shuffled), dtype=np.float64)
    with torch.no_grad():
        expected = torch.export.load(str(out / "model.pt2")).module()(torch.as_tensor(x)).numpy()[:, 0]
    np.testing.assert_allclose(pred, expected, rtol=1e-6)
    assert task.score(y, pred, info)["smape"] == pytest.approx(evaluated["candidate"]["smape"], rel=1e-6)


def test_the_package_task_runs_through_the_whole_flow(flow_run):
    """``trainflow run`` (a fresh process: the task found through its entry point) validates,
    trains, evaluates with the package's own metrics and baseline, gates and registers."""
    from core.config import load_config
    from tasks import get_task

    cfg = load_config(CONFIG)
    code, s, err = flow_run
    assert code == 0, (s.get("error"), err[-3000:])
    assert s["status"] == "registered" and s["model_name"] == cfg.registry.model_name
    assert s["manifest"]["config_name"] == "timeseries"
    # The package's own metrics, in their directions, decided the gates.
    gates = {g["name"]: g for g in s["gates"]}
    assert gates["smape"]["op"] == "<=" and gates["directional_accuracy"]["op"] == ">="
    assert gates["smape_vs_baseline"]["passed"]
    assert s["metrics"]["smape"] < s["baseline"]["smape"]
    assert get_task(TASK).name == TASK
