"""The GitHub Actions workflow is valid against GitHub's workflow schema (as vendored by
check-jsonschema, offline) and runs the lock check, the tests and the pipeline on the CLI's
exit code; scripts/ci_summary.py turns the summary JSON into the CI verdict."""

from __future__ import annotations

import copy
import importlib.resources
import json
import re

import jsonschema
import pytest
import yaml

from core.env import TELEMETRY_OFF
from tests.conftest import load_script


@pytest.fixture(scope="module")
def workflow(repo_root):
    # PyYAML reads the bare key `on` as True (YAML 1.1); GitHub reads it as "on".
    data = yaml.safe_load((repo_root / ".github" / "workflows" / "ci.yml").read_text())
    data["on"] = data.pop(True)
    return data


@pytest.fixture(scope="module")
def validator():
    schema_file = importlib.resources.files("check_jsonschema") / "builtin_schemas/vendor/github-workflows.json"
    schema = json.loads(schema_file.read_text())
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def ci_summary():
    return load_script("ci_summary")


def _runs(job) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_workflow_matches_githubs_schema(workflow, validator):
    errors = sorted(validator.iter_errors(workflow), key=str)
    assert not errors, [e.message for e in errors]


@pytest.mark.parametrize("breakage", ["no_runs_on", "bad_timeout", "unknown_key", "step_without_action"])
def test_schema_rejects_broken_workflows(workflow, validator, breakage):
    bad = copy.deepcopy(workflow)
    job = bad["jobs"]["pipeline"]
    if breakage == "no_runs_on":
        del job["runs-on"]
    elif breakage == "bad_timeout":
        job["timeout-minutes"] = [30]
    elif breakage == "unknown_key":
        job["run-on"] = job.pop("runs-on")
    else:
        job["steps"].append({"name": "does nothing"})
    assert list(validator.iter_errors(bad))


def test_jobs_check_lock_run_tests_and_pipeline(workflow):
    jobs = workflow["jobs"]
    assert "scripts/check_lock.py" in _runs(jobs["lock"])
    for name in ("test", "pipeline"):
        assert jobs[name]["needs"] == "lock"
        runs = _runs(jobs[name])
        assert "--require-hashes" in runs and "requirements/lock-cpu.txt" in runs
    assert "make test" in _runs(jobs["test"])
    pipeline = _runs(jobs["pipeline"])
    assert "make run ARGS=" in pipeline and "--summary-json out/summary.json" in pipeline  # trainflow run
    assert 'ci_summary.py out/summary.json --exit-code "$code"' in pipeline
    assert all(job.get("timeout-minutes") for job in jobs.values())
    deploy = _runs(jobs["deployment"])
    assert "prefect deployment run trainflow-pipeline/ci --watch" in deploy
    assert jobs["deployment"]["env"]["TRAINFLOW_REPO_DIR"]  # required by the ci deployment's build step


def test_every_action_is_pinned_by_commit_sha_with_its_version(repo_root, workflow):
    # The comment holds the tag the SHA was taken from; PyYAML drops comments, so read the lines.
    lines = [line.strip() for line in (repo_root / ".github" / "workflows" / "ci.yml").read_text().splitlines()]
    uses = [line.removeprefix("- ") for line in lines if line.removeprefix("- ").startswith("uses:")]
    assert len(uses) == sum(1 for job in workflow["jobs"].values() for step in job["steps"] if "uses" in step)
    for line in uses:
        assert re.fullmatch(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}\s+# v\d+(\.\d+)*", line), line


def test_test_tools_install_from_the_hashed_dev_lock(workflow):
    from core.lock import DEV_LOCK

    runs = _runs(workflow["jobs"]["test"])
    assert f"--require-hashes --no-deps -r {DEV_LOCK}" in runs
    # Nothing in the test or pipeline jobs resolves from an index without hashes.
    for name in ("test", "pipeline"):
        for line in _runs(workflow["jobs"][name]).splitlines():
            if "pip install" in line:
                assert "--require-hashes" in line or "--no-deps" in line, line
                assert "[dev]" not in line, line


def test_workflow_turns_telemetry_off(workflow):
    env = workflow["env"]
    for key in ("DO_NOT_TRACK", "MLFLOW_DISABLE_TELEMETRY", "PREFECT_SERVER_ANALYTICS_ENABLED",
                "GX_ANALYTICS_ENABLED", "DVC_NO_ANALYTICS"):
        assert env[key] == TELEMETRY_OFF[key]


def _registered(**kw) -> dict:
    summary = {"status": "registered", "exit_code": 0, "model_name": "digits-classifier", "model_version": "3",
               "aliases": ["challenger"], "metrics": {"accuracy": 0.97}, "mlflow_run_id": "abc",
               "gates": [{"name": "min_accuracy", "value": 0.97, "threshold": 0.95, "op": ">=", "passed": True}],
               "manifest": {"data": {"md5": "d41d8cd9.dir"}, "config_sha256": "f" * 64,
                            "image": {"ref": "local", "digest": "local"}}}
    return {**summary, **kw}


@pytest.mark.parametrize("code", [1, 2, 3, 4])
def test_ci_verdict_is_the_runs_exit_code(ci_summary, code):
    assert ci_summary.verdict({"status": "x", "exit_code": code}, code) == (code, [])


def test_ci_verdict_refuses_a_hollow_success(ci_summary):
    assert ci_summary.verdict(_registered(), 0) == (0, [])
    code, problems = ci_summary.verdict(_registered(model_version=None, manifest={}), 0)
    assert code == 1 and "model_version, manifest" in problems[0]
    failed_gate = _registered(gates=[{"name": "min_accuracy", "value": 0.5, "threshold": 0.95, "op": ">=",
                                      "passed": False}])
    assert ci_summary.verdict(failed_gate, 0) == (1, ["exit 0 with failed gates: min_accuracy"])


def test_ci_verdict_flags_disagreement_and_garbage(ci_summary):
    assert ci_summary.verdict({"exit_code": 3}, 0) == (3, ["trainflow exited 0 but the summary says 3"])
    assert ci_summary.verdict({"exit_code": "3"})[0] == 1


def test_ci_summary_main_writes_markdown_and_exits(ci_summary, tmp_path, capsys):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(_registered()))
    md = tmp_path / "step-summary.md"
    assert ci_summary.main([str(path), "--exit-code", "0", "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "digits-classifier` v3 @challenger" in text and "min_accuracy: 0.9700 >= 0.9500 (pass)" in text
    assert ci_summary.main([str(tmp_path / "missing.json"), "--exit-code", "2"]) == 2
    assert "no readable summary" in capsys.readouterr().err
