"""The workspace check's verdict on DVC's statuses, and its line (core.workspace)."""

from __future__ import annotations

import pytest

from core.errors import DataUnavailableError
from core.workspace import check_tracked, first_change


def test_a_modified_or_new_output_is_a_change_and_names_both_remedies():
    rows = [("data/a.dvc", "data/a", {}), ("models/m.dvc", "models/m", {"models/m": "modified"})]
    assert first_change(rows) == (
        "models/m: the workspace differs from models/m.dvc (dvc status: modified), so the recorded data version "
        "is not the data that would train; record it with `dvc add models/m` and commit models/m.dvc, or "
        "restore the recorded data with `dvc checkout models/m.dvc`")
    assert "(dvc status: new)" in first_change([("d.dvc", "d", {"d": "new"})])


def test_unchanged_and_not_pulled_outputs_are_left_to_the_readers():
    assert first_change([("d.dvc", "d", {}), ("e.dvc", "e", {"e": "deleted"})]) is None


def test_a_dvc_file_outside_a_dvc_repository_is_refused(tmp_path):
    (tmp_path / "data.dvc").write_text("outs:\n- md5: 0123456789abcdef0123456789abcdef.dir\n  path: data\n")
    with pytest.raises(DataUnavailableError, match=r"data.dvc: cannot compare the workspace with it: .* is not a DVC"):
        check_tracked(tmp_path, ["data.dvc"])
