"""The retrain flow's decisions, on one real git + DVC project whose data moves on step by step:
no champion -> train; unchanged -> up-to-date; new data -> train; new data without drift under
``policy: drift`` -> skip; drifted data -> train. Real Prefect, MLflow, DVC, GX and torchrun.

The tests share the project and the registry and run in file order (each names what it expects
from the one before).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from core.config import load_config
from flows.cli import main
from tests.integration.conftest import build_project, commit_data

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

MODEL = "retrain-digits"
# Two epochs make a model near the gates; these runs are about when to train, not how well.
CONFIG = "tests/configs/retrain.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory, repo_root, bundled_data):
    """(project, TRAINFLOW_HOME) shared by the module; the env points at them while a test runs."""
    proj = build_project(tmp_path_factory.mktemp("retrain") / "proj", repo_root, bundled_data)
    return proj, tmp_path_factory.mktemp("retrain-home")


@pytest.fixture
def project(world, monkeypatch, clean_env):
    proj, home = world
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(proj)
    return proj


def retrain(tmp_path, *extra) -> tuple[int, dict]:
    out = tmp_path / "summary.json"
    code = main(["retrain", "--config", CONFIG, *extra, "--summary-json", str(out)])
    return code, json.loads(out.read_text())


def versions() -> list[str]:
    from mlflow import MlflowClient

    return sorted(str(v.version) for v in MlflowClient().search_model_versions(f"name='{MODEL}'"))


def champion() -> dict:
    from mlflow import MlflowClient

    mv = MlflowClient().get_model_version_by_alias(MODEL, "champion")
    return {"version": str(mv.version), **mv.tags}


def drop_rows(n: int, seed: int):
    """New data of the same distribution: ``n`` training rows fewer."""
    def mutate(train, test):
        keep = train.drop(train.sample(n=n, random_state=seed).index)
        train.drop(train.index.difference(keep.index), inplace=True)
    return mutate


def brighten(train, test):
    """A sensor that reads brighter: every pixel +4, clipped to the valid 0..16."""
    for df in (train, test):
        cols = [c for c in df.columns if c.startswith("pixel_")]
        df[cols] = np.minimum(df[cols] + 4, 16)


def test_without_a_champion_retrain_trains_and_promotes(project, tmp_path):
    code, s = retrain(tmp_path)
    assert code == 0, s.get("error")
    assert s["status"] == "registered" and s["model_version"] == "1" and "champion" in s["aliases"]
    assert s["retrain"]["train"] is True
    assert any("has no @champion" in r for r in s["retrain"]["reasons"])
    assert s["validation"]["cached"] is False  # this data was never validated before


def test_unchanged_data_config_and_code_skip_as_up_to_date(project, tmp_path, capsys):
    before = versions()
    assert before == ["1"]
    code, s = retrain(tmp_path)
    assert code == 0 and s["status"] == "up-to-date" and s["exit_code"] == 0
    d = s["retrain"]
    assert d["train"] is False and d["reasons"] == []
    assert d["current"]["data_md5"] == d["champion"]["data_md5"]
    assert d["current"]["config_sha256"] == d["champion"]["config_sha256"]
    assert d["code_changes"] == []
    assert "up-to-date" in capsys.readouterr().err
    assert versions() == before  # nothing trained, nothing registered


def test_forced_retrain_trains_and_reuses_the_cached_validation(project, tmp_path):
    code, s = retrain(tmp_path, "--force")
    assert code == 0, s.get("error")
    assert s["status"] == "registered" and s["retrain"]["reasons"] == ["forced"]
    # The same bytes checked by the same suite: GX did not run again (Prefect served the cached result).
    assert s["validation"]["cached"] is True
    # Same data, config, code and seed on CPU: the very same weights, so it ties: registered as
    # @challenger, and the champion stays (equal is not better: gates.min_improvement).
    first = champion()
    assert s["training"]["weights_sha256"] == first["weights_sha256"]
    assert s["model_version"] == "2" and first["version"] == "1" and s["aliases"] == ["challenger"]
    assert not s["promotion"]["promoted"] and "ties the champion's" in s["promotion"]["reason"]


def test_policy_section_is_not_part_of_the_config_id(project, tmp_path):
    code, s = retrain(tmp_path, "--set", "retrain.psi_threshold=0.5", "--set", "retrain.policy=drift")
    assert code == 0 and s["status"] == "up-to-date"


def test_new_data_version_trains_and_reports_no_drift(project, tmp_path):
    old = champion()
    n_before = len(pd.read_csv(project / "data" / "digits" / "train.csv"))
    md5 = commit_data(project, drop_rows(40, seed=1))
    code, s = retrain(tmp_path)
    assert code == 0, s.get("error")
    d = s["retrain"]
    assert d["train"] and s["status"] == "registered"
    assert any(r.startswith(f"data changed: {old['data_md5']} -> {md5}") for r in d["reasons"])
    # Only data/digits.dvc changed in git: that is not a code change.
    assert d["code_changes"] == [] and not any(r.startswith("code") for r in d["reasons"])
    drift = d["drift"]
    assert drift is not None and drift["drifted"] is False and drift["n_features"] == 64
    assert drift["rows"] == {"reference": n_before, "current": n_before - 40}
    assert s["validation"]["cached"] is False
    assert s["manifest"]["data"]["md5"] == md5
    # Promoted only if it beats the champion on the new test split (both were scored on it).
    promo = s["promotion"]
    margin = load_config(project / "configs" / "digits.yaml").gates.min_improvement
    assert promo["promoted"] == (s["metrics"]["accuracy"] > s["champion"]["accuracy"] + margin
                                 or abs(s["metrics"]["accuracy"] - s["champion"]["accuracy"]) <= margin
                                 and s["metrics"]["macro_f1"] > s["champion"]["macro_f1"] + margin)
    assert champion()["version"] == (s["model_version"] if promo["promoted"] else old["version"])
    # The drift report went to the pipeline's MLflow run.
    from mlflow import MlflowClient

    arts = {a.path for a in MlflowClient().list_artifacts(s["mlflow_run_id"], "retrain")}
    assert {"retrain/drift.md", "retrain/drift.json", "retrain/decision.json"} <= arts


def test_new_data_without_drift_is_skipped_under_the_drift_policy(project, tmp_path):
    before = versions()
    commit_data(project, drop_rows(30, seed=2))
    code, s = retrain(tmp_path, "--set", "retrain.policy=drift")
    assert code == 0 and s["status"] == "no-drift"
    d = s["retrain"]
    assert d["train"] is False and d["drift"]["drifted"] is False
    assert "did not drift" in d["skip_reason"]
    assert versions() == before


def test_drifted_data_trains_under_the_drift_policy(project, tmp_path):
    commit_data(project, brighten)
    code, s = retrain(tmp_path, "--set", "retrain.policy=drift")
    assert code == 0, s.get("error")
    d = s["retrain"]
    assert d["train"] and s["status"] == "registered"
    assert any(r.startswith("data drifted:") for r in d["reasons"])
    drift = d["drift"]
    assert drift["drifted"] and drift["drifted_fraction"] > 0.1
    worst = max(drift["features"], key=lambda f: f["psi"])
    assert worst["psi"] > 0.2 and worst["ks_pvalue"] < 0.01 and worst["drifted"]


def test_validation_task_is_cached_on_data_and_suite(project, tmp_path):
    """The GX task itself: a second call with the same data and suite is served from the cache."""
    from prefect import flow

    from core.config import load_config
    from core.expectations import load_expectations
    from flows.pipeline import run_expectations
    from tasks import get_task
    from validation.cache import cache_file
    from validation.gx_run import data_hash, suite_key

    cfg = load_config(project / "configs" / "digits.yaml")
    results = tmp_path / "results"

    @flow
    def twice(pixel_max: int):
        plan = get_task(cfg.task).validation_plan(cfg, project)
        exp = plan.params["expectations"]
        tightened = exp.model_copy(update={"columns": [
            c.model_copy(update={"max": pixel_max}) if c.name.startswith("pixel_") else c for c in exp.columns]})
        plan.params["expectations"] = tightened
        args = (plan, data_hash(plan.files), suite_key(plan), str(tmp_path / "reports"),
                str(cache_file(results, data_hash(plan.files), suite_key(plan))))
        return [run_expectations(*args) for _ in range(2)]

    assert load_expectations(project / cfg.dataset.expectations_file).column("pixel_5").max == 16
    first, second = twice(16)
    assert first["cached"] is False and second["cached"] is True
    assert second["duration_s"] == first["duration_s"]
    # Another suite (a different bound) is another key: validated afresh.
    other, _ = twice(15)
    assert other["cached"] is False and other["success"] is False
