"""A failing worker comes back as an error naming the rank and carrying its traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.config import load_config
from core.errors import TrainingFailedError
from training.launcher import make_spec, run_job

pytestmark = pytest.mark.fault


def test_rank_error_names_rank_and_traceback(repo_root, bundled_data, tmp_path):
    # A dataset whose train file has the wrong header: every rank raises while loading.
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    shutil.copy(bundled_data / "test.csv", root / "data" / "test.csv")
    lines = (bundled_data / "train.csv").read_text().splitlines()
    (root / "data" / "train.csv").write_text("\n".join(["bad," + lines[0], *lines[1:]]) + "\n")
    cfg = load_config(repo_root / "configs" / "digits.yaml", ["dataset.path=data", "training.timeout_s=120"])
    spec = make_spec(cfg, tmp_path / "out", root, "md5-of-test", nproc=2)
    with pytest.raises(TrainingFailedError) as err:
        run_job(spec)
    assert err.value.rank in (0, 1)
    assert f"rank {err.value.rank}" in str(err.value)
    assert "columns differ from the config" in str(err.value)
    assert "Traceback" in err.value.traceback and "read_csv" in err.value.traceback
    assert processes_mentioning(spec.out_dir) == []


def test_hung_job_is_killed_at_the_timeout(repo_root, bundled_data, tmp_path):
    cfg = load_config(repo_root / "configs" / "digits.yaml", ["training.timeout_s=3"])
    spec = make_spec(cfg, tmp_path / "out", repo_root, "md5", nproc=2)
    with pytest.raises(TrainingFailedError, match="exceeded training.timeout_s=3s"):
        run_job(spec)
    assert processes_mentioning(spec.out_dir) == []  # the whole process group is gone


def processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            continue
    return found
