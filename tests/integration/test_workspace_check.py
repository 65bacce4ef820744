"""The data version a run records is the data it trains on: a DVC-tracked folder changed without
`dvc add` (one row of a table, one image) stops `run` and `retrain` before anything validates, with
one line naming the path and both remedies. Real git, DVC and Prefect."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from core.errors import WorkspaceChangedError
from core.workspace import check_tracked, first_change, workspace_statuses
from flows.cli import main
from tests.integration.conftest import DVC_BIN, GIT_ID, run

pytestmark = [pytest.mark.integration]


def change_one_row(proj) -> None:
    """The first data row of the table's training split gets another label, as an editor would."""
    path = proj / "data" / "digits" / "train.csv"
    lines = path.read_text().splitlines(keepends=True)
    cells = lines[1].rstrip("\n").split(",")
    cells[-1] = "9" if cells[-1] != "9" else "8"
    lines[1] = ",".join(cells) + "\n"
    path.write_text("".join(lines))


def test_an_unchanged_project_passes_without_reading_its_files(make_project):
    """DVC's state (inode, size, mtime per file) answers for an unchanged folder: bytes rewritten
    in place, size and mtime kept, go unnoticed, which shows no file was hashed again (exactly what
    `dvc status` says of such a folder)."""
    proj = make_project()
    check_tracked(proj, ["data/digits.dvc"])
    path = proj / "data" / "digits" / "test.csv"
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-2] = ord("0") if data[-2] != ord("0") else ord("1")  # one label digit, same length
    with open(path, "r+b") as f:  # same inode
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    check_tracked(proj, ["data/digits.dvc"])
    assert first_change(workspace_statuses(proj, ["data/digits.dvc"])) is None


def test_a_changed_image_is_refused_naming_the_folder_and_both_remedies(tmp_path, repo_root, bundled_data):
    proj = tmp_path / "images"
    src = repo_root / "data" / "digit-images"
    for split in ("train", "test"):
        for label in ("0", "1"):
            shutil.copytree(src / split / label, proj / "data" / "digit-images" / split / label)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "add", "-q", "data/digit-images"], proj)
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", "images"], proj)
    check_tracked(proj, ["data/digit-images.dvc"])
    one, other = sorted((proj / "data" / "digit-images" / "train" / "0").iterdir())[:2]
    one.write_bytes(other.read_bytes())  # one image replaced by another
    with pytest.raises(WorkspaceChangedError) as err:
        check_tracked(proj, ["data/digit-images.dvc"])
    assert str(err.value).splitlines() == [str(err.value)]
    assert str(err.value).startswith("data/digit-images: the workspace differs from data/digit-images.dvc")
    assert "`dvc add data/digit-images`" in str(err.value) and "`dvc checkout data/digit-images.dvc`" in str(err.value)
    run([DVC_BIN, "checkout", "-q", "data/digit-images.dvc"], proj)  # the remedy named works
    check_tracked(proj, ["data/digit-images.dvc"])


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("command", ["run", "retrain"])
def test_run_and_retrain_refuse_a_changed_table_with_exit_2(command, make_project, tmp_path, monkeypatch,
                                                           clean_env):
    proj = make_project()
    recorded = (proj / "data" / "digits.dvc").read_text()
    change_one_row(proj)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(proj)
    out = tmp_path / "summary.json"
    code = main([command, "--config", "tests/configs/digits-quick.yaml", "--summary-json", str(out)])
    error = json.loads(out.read_text()).get("error")
    assert code == 2, error
    assert error == ("data/digits: the workspace differs from data/digits.dvc (dvc status: modified), so the "
                     "recorded data version is not the data that would train; record it with `dvc add "
                     "data/digits` and commit data/digits.dvc, or restore the recorded data with "
                     "`dvc checkout data/digits.dvc`")
    assert (proj / "data" / "digits.dvc").read_text() == recorded  # nothing was added for the user
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
