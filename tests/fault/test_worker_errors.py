"""A failing or hung worker fails the whole job in bounded time, naming the rank; nothing is left running."""

from __future__ import annotations

import shutil

import pytest

from core.config import load_config
from core.errors import TrainingFailedError
from tests.engine_helpers import processes_mentioning, train
from training.launcher import make_spec, run_job
from training.plan import HostFacts, plan_launch

pytestmark = pytest.mark.fault


def test_an_input_error_in_a_worker_names_the_rank_and_traceback_and_is_not_retried(repo_root, bundled_data,
                                                                                    tmp_path):
    # A train file whose label column is renamed: every rank raises a DataUnavailableError while
    # loading. Deterministic: torchrun's restarts (3 allowed) would fail the same way, so none is made.
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "configs").mkdir()
    shutil.copy(repo_root / "configs" / "digits.expectations.yaml", root / "configs")
    shutil.copy(bundled_data / "test.csv", root / "data" / "test.csv")
    lines = (bundled_data / "train.csv").read_text().splitlines()
    (root / "data" / "train.csv").write_text("\n".join([lines[0].replace(",label", ",digit"), *lines[1:]]) + "\n")
    cfg = load_config(repo_root / "configs" / "digits.yaml",
                      ["dataset.path=data", "training.timeout_s=120", "training.max_restarts=3"])
    spec = make_spec(plan_launch(cfg, HostFacts(), 2), tmp_path / "out", root, "md5-of-test")
    with pytest.raises(TrainingFailedError) as err:
        run_job(spec)
    assert err.value.rank in (0, 1)
    assert f"rank {err.value.rank}" in str(err.value)
    assert "train split lacks column(s) ['label']" in str(err.value) and "not retried" in str(err.value)
    assert "Traceback" in err.value.traceback and "load_data" in err.value.traceback
    assert not list((tmp_path / "out" / "torchrun").glob("*/attempt_1"))  # no restart was attempted
    assert "exceeded training.timeout_s" not in str(err.value)  # stopped at the error, not at the job's limit
    assert processes_mentioning(spec.out_dir) == []


def test_rank_crash_fails_the_job_naming_that_rank(bundled_data, tmp_path):
    with pytest.raises(TrainingFailedError) as err:
        train(tmp_path / "out", ["training.max_restarts=0"], env={"TRAINFLOW_FAULT": "raise@step=5,rank=1"})
    assert "exceeded training.timeout_s" not in str(err.value)  # it fails at the crash, it does not hang
    assert err.value.rank == 1 and "rank 1" in str(err.value)
    assert "InjectedFault" in str(err.value) and "Traceback" in err.value.traceback
    assert processes_mentioning(str(tmp_path / "out")) == []


def test_hung_rank_fails_at_the_collective_timeout(bundled_data, tmp_path):
    with pytest.raises(TrainingFailedError) as err:
        train(tmp_path / "out", ["training.max_restarts=0", "training.collective_timeout_s=8", "training.preempt_grace_s=2"],
              env={"TRAINFLOW_FAULT": "hang@step=5,rank=1"})
    # The collective timeout ended it, not the job's own limit (timeout_s in tests/configs/digits-engine.yaml).
    assert "exceeded training.timeout_s" not in str(err.value)
    assert err.value.rank == 0  # the peer that waited is the one that reports the timeout
    assert processes_mentioning(str(tmp_path / "out")) == []


def test_hung_job_is_killed_at_the_timeout(repo_root, bundled_data, tmp_path):
    cfg = load_config(repo_root / "configs" / "digits.yaml", ["training.timeout_s=3"])
    spec = make_spec(plan_launch(cfg, HostFacts(), 2), tmp_path / "out", repo_root, "md5")
    with pytest.raises(TrainingFailedError, match="exceeded training.timeout_s=3s"):
        run_job(spec)
    assert processes_mentioning(spec.out_dir) == []
