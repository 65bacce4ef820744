"""Input that cannot hurt the host (issue 46), through the real parts: a label of thousands of classes is
refused by ``trainflow run`` at validation with one line (a config written without init's check), and
an epoch of zero steps fails the torchrun job instead of completing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from core.errors import TrainingFailedError
from tests.engine_helpers import train
from tests.integration.conftest import DVC_BIN, run
from tests.integration.test_bring_your_own import BOUNDS, commit_all, trainflow

pytestmark = pytest.mark.integration


def codes(n: int, classes: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"f1": rng.normal(size=n), "f2": rng.normal(size=n),
                         "code": [f"c{i % classes}" for i in range(n)]})


@pytest.mark.usefixtures("prefect_api")
def test_a_run_refuses_thousands_of_classes_at_validation_in_one_line(tmp_path):
    from flows.init import init_project

    proj = tmp_path / "proj"
    (proj / "data" / "codes").mkdir(parents=True)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    (proj / ".gitignore").write_text(".trainflow/\n")
    csv = proj / "data" / "codes" / "codes.csv"
    codes(600, 3).to_csv(csv, index=False)
    init_project(proj, "data/codes", "code")  # three classes: init accepts them
    # The data becomes 5,000 codes in 6,000 rows, tracked and committed: a config init never saw.
    codes(6000, 5000).to_csv(csv, index=False)
    run([DVC_BIN, "add", "-q", "data/codes"], proj)
    commit_all(proj, "codes")

    code, summary, err = trainflow(proj, "run", "--config", "configs/codes.yaml", *BOUNDS)
    assert code == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("trainflow: error:")]
    assert len(errors) == 1 and "label 'code' has 5,000 distinct values in 6,000 labeled rows" in errors[0], err
    assert not list((proj / ".trainflow").glob("train/*/result.json"))  # nothing trained


def test_an_epoch_of_zero_steps_fails_the_job(tmp_path):
    # Each class's train rows all go to the per-epoch validation split: nothing is left to train on.
    with pytest.raises(TrainingFailedError, match=r"ZeroStepsError: an epoch has zero steps: 0 train rows"):
        train(tmp_path / "out", ["dataset.val_fraction=0.999", "training.epochs=1"], nproc=1)
