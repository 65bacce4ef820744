"""Pure logic of the registry package: keys, params, metrics, tags, limits. No MLflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.store import experiment_artifact_location, is_server, sqlite_path
from registry.values import (
    MAX_KEY_LENGTH,
    MAX_MODEL_TAG_VALUE_LENGTH,
    MAX_PARAM_VALUE_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    TRUNCATION_MARK,
    check_run_status,
    chunks,
    clean_key,
    clean_tags,
    flatten,
    flatten_metrics,
    flatten_params,
    metric_value,
    truncate,
)


def test_truncate_keeps_short_values_and_marks_cut_ones():
    assert truncate("abc", 10) == "abc"
    cut = truncate("x" * 7000, MAX_PARAM_VALUE_LENGTH)
    assert len(cut) == MAX_PARAM_VALUE_LENGTH
    assert cut.endswith(TRUNCATION_MARK)
    assert truncate("abcdef", 3) == TRUNCATION_MARK[:3]


def test_flatten_nests_with_dots_and_keeps_empty_mappings_as_leaves():
    assert flatten({"a": {"b": {"c": 1}, "d": 2}, "e": {}}) == {"a.b.c": 1, "a.d": 2, "e": {}}


def test_flatten_params_stringifies_values():
    flat = flatten_params({
        "training": {"lr": 0.002, "epochs": 12, "grad_clip": None, "deterministic": True},
        "model": {"channels": (16, 32)},
        "tags": {"b", "a"},
        "empty": {},
    })
    assert flat == {
        "training.lr": "0.002",
        "training.epochs": "12",
        "training.grad_clip": "None",
        "training.deterministic": "True",
        "model.channels": "[16,32]",
        "tags": '["a","b"]',
        "empty": "{}",
    }
    assert all(isinstance(v, str) for v in flat.values())


def test_flatten_params_truncates_long_values():
    flat = flatten_params({"config": "y" * (MAX_PARAM_VALUE_LENGTH + 1)})
    assert len(flat["config"]) == MAX_PARAM_VALUE_LENGTH
    assert flat["config"].endswith(TRUNCATION_MARK)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("training.lr", "training.lr"),
        ("a b-c:d/e_f", "a b-c:d/e_f"),
        ("bad!key?", "bad_key_"),
        ("/lead/and//trailing/", "lead/and/trailing"),
        ("a/./b/../c", "a/_/b/_/c"),
        ("", "_"),
        (3, "3"),
    ],
)
def test_clean_key_makes_valid_mlflow_names(key, expected):
    assert clean_key(key) == expected


def test_clean_key_cuts_long_keys_and_keeps_them_distinct():
    a = clean_key("k" * 300 + "a")
    b = clean_key("k" * 300 + "b")
    assert len(a) == len(b) == MAX_KEY_LENGTH
    assert a != b
    assert clean_key("k" * 300 + "a") == a  # deterministic


def test_clean_tags_limits_values():
    tags = clean_tags({"git_sha": "abc", "note": None, "big": "z" * 9000, "n": 3})
    assert tags["git_sha"] == "abc"
    assert tags["note"] == ""
    assert tags["n"] == "3"
    assert len(tags["big"]) == MAX_TAG_VALUE_LENGTH
    roomy = clean_tags({"big": "z" * 9000}, MAX_MODEL_TAG_VALUE_LENGTH)
    assert roomy["big"] == "z" * 9000


def test_flatten_metrics_accepts_numbers_and_numpy_scalars():
    np = pytest.importorskip("numpy")
    flat = flatten_metrics({
        "accuracy": np.float32(0.5),
        "loss": 1,
        "ok": True,
        "recall": {"0": np.float64(0.25), "1": np.array(0.75)},
        "nan": float("nan"),
    })
    assert flat["accuracy"] == 0.5
    assert flat["loss"] == 1.0
    assert flat["ok"] == 1.0
    assert flat["recall.0"] == 0.25
    assert flat["recall.1"] == 0.75
    assert flat["nan"] != flat["nan"]
    assert all(type(v) is float for v in flat.values())


@pytest.mark.parametrize("bad", ["0.9", None, [1, 2], object()])
def test_metric_value_rejects_non_numbers(bad):
    with pytest.raises(TypeError, match="metric 'm'"):
        metric_value("m", bad)


def test_check_run_status():
    assert check_run_status("finished") == "FINISHED"
    assert check_run_status("FAILED") == "FAILED"
    assert check_run_status("KILLED") == "KILLED"
    with pytest.raises(ValueError, match="RUNNING"):
        check_run_status("RUNNING")


def test_chunks():
    assert chunks(list(range(5)), 2) == [[0, 1], [2, 3], [4]]
    assert chunks([], 100) == []


def test_sqlite_path_reads_absolute_and_relative_uris():
    assert sqlite_path("sqlite:////abs/dir/mlflow.db") == Path("/abs/dir/mlflow.db")
    assert sqlite_path("sqlite:///rel/mlflow.db") == Path("rel/mlflow.db")
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("http://localhost:5000") is None


def test_experiment_artifact_location_is_a_file_uri_under_the_root(tmp_path):
    assert experiment_artifact_location(tmp_path, "trainflow-digits") == (
        f"{tmp_path.resolve().as_uri()}/trainflow-digits"
    )
    assert experiment_artifact_location(tmp_path, "a b/c").endswith("/a_b_c")




def test_only_http_tracking_uris_count_as_servers_that_own_artifact_roots():
    assert is_server("http://127.0.0.1:5000") and is_server("HTTPS://mlflow.internal")
    assert not is_server("sqlite:////tmp/mlflow.db")
    assert not is_server("postgresql+psycopg2://u@h/db")
    assert not is_server("file:///tmp/mlruns")

