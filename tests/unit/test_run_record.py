"""core.metrics_file's run record: which MLflow run a training folder logs into, checked before use."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from core.metrics_file import (
    CONFIG_TAG,
    latest_steps,
    OUT_DIR_TAG,
    RUN_FILE,
    read_run_record,
    run_tags,
    verify_recorded_run,
    write_run_record,
)

RUN = "0123456789abcdef0123456789abcdef"


def test_a_written_record_reads_back(tmp_path):
    assert read_run_record(tmp_path) is None
    write_run_record(tmp_path, RUN, "cfg1")
    assert read_run_record(tmp_path) == {"run_id": RUN, "config_id": "cfg1", "out_dir": str(tmp_path.resolve())}
    write_run_record(tmp_path, RUN, "cfg1", relayed_bytes=120)
    assert read_run_record(tmp_path)["relayed_bytes"] == 120
    assert [p.name for p in tmp_path.iterdir()] == [RUN_FILE]  # no temporary file left


@pytest.mark.parametrize("text", [
    "not json", "[]", json.dumps({"run_id": "../../etc"}), json.dumps({"run_id": RUN.upper()}),
    json.dumps({"run_id": RUN, "relayed_bytes": -1}), json.dumps({"run_id": RUN, "relayed_bytes": True}),
    json.dumps({"run_id": RUN, "pad": "x" * 5000}),
])
def test_a_record_that_is_not_one_is_ignored_with_a_warning(tmp_path, caplog, text):
    (tmp_path / RUN_FILE).write_text(text)
    assert read_run_record(tmp_path) is None
    assert "no MLflow run is resumed" in caplog.text


def fake_store(runs: dict):
    def get_run(run_id):
        if run_id not in runs:
            raise LookupError(run_id)
        stage, tags = runs[run_id]
        return SimpleNamespace(info=SimpleNamespace(lifecycle_stage=stage), data=SimpleNamespace(tags=tags))
    return get_run


def test_a_recorded_run_must_exist_be_active_and_carry_this_trainings_tags(tmp_path):
    rec = {"run_id": RUN}
    mine = run_tags("cfg1", tmp_path)
    assert mine == {CONFIG_TAG: "cfg1", OUT_DIR_TAG: str(tmp_path.resolve())}
    assert verify_recorded_run(fake_store({RUN: ("active", mine)}), rec, "cfg1", tmp_path) is None
    assert "not in this tracking store" in verify_recorded_run(fake_store({}), rec, "cfg1", tmp_path)
    assert "deleted" in verify_recorded_run(fake_store({RUN: ("deleted", mine)}), rec, "cfg1", tmp_path)
    # Another config's run, a run of another folder, a run that never recorded a training.
    assert CONFIG_TAG in verify_recorded_run(fake_store({RUN: ("active", mine)}), rec, "cfg2", tmp_path)
    other = run_tags("cfg1", tmp_path / "elsewhere")
    assert OUT_DIR_TAG in verify_recorded_run(fake_store({RUN: ("active", other)}), rec, "cfg1", tmp_path)
    assert verify_recorded_run(fake_store({RUN: ("active", {})}), rec, "cfg1", tmp_path) is not None


def test_latest_steps_reads_each_keys_last_step_from_the_run():
    metric = lambda k, step: SimpleNamespace(key=k, step=step)  # noqa: E731
    run = SimpleNamespace(data=SimpleNamespace(_metric_objs=[metric("a", 7), metric("b", 0)]))
    assert latest_steps(run) == {"a": 7, "b": 0}
    assert latest_steps(SimpleNamespace(data=SimpleNamespace())) == {}
