"""Hostile or careless config input gets one line naming the key, and never writes outside TRAINFLOW_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from core.config import config_from_dict, load_config
from core.errors import ConfigError, DataUnavailableError

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "digits.yaml"


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    """The CLI in-process with TRAINFLOW_HOME in tmp_path; whatever it sets in os.environ is undone."""
    saved = dict(os.environ)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    for name in ("PREFECT_HOME", "PREFECT_API_URL", "TRAINFLOW_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "home"
    os.environ.clear()
    os.environ.update(saved)


def _files(folder: Path, leave_out: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if leave_out not in (p, *p.parents)}


@pytest.mark.parametrize("name", ["../../x", "/tmp/x"])
def test_a_name_that_leaves_home_is_a_config_error_and_nothing_is_written_outside(name, tmp_path, cli_env, capsys):
    from flows.cli import main
    from training.slots import claim_train_dir

    home = cli_env
    # Absolute: a folder of this test's own (a name like /tmp/x), so the check below sees any write.
    name = str(tmp_path / "tmp" / "x") if name.startswith("/") else name
    home.mkdir(parents=True)
    before = _files(tmp_path, home)
    with pytest.raises(ConfigError, match=r"name: must be a slug .*got '" + name.replace(".", r"\.")):
        load_config(DIGITS, [f"name={name}"])
    for command in (["run"], ["train", "--out", str(home / "out")]):
        assert main([*command, "--config", str(DIGITS), "--set", f"name={name}"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("trainflow: error:") and "name: must be a slug" in err[0]
    # The code that builds the training folder refuses it too (a config that skipped load_config).
    with pytest.raises(ConfigError, match="outside TRAINFLOW_HOME"):
        claim_train_dir(home, name, "c" * 64, "d" * 32, 2)
    assert _files(tmp_path, home) == before


@pytest.mark.parametrize("value", ["a/b", "..", ".", "", "x y", "/abs", "-rf"])
def test_registry_model_name_is_a_slug(value):
    with pytest.raises(ConfigError, match="registry.model_name: must be a slug|registry.model_name: string"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "registry": {"model_name": value}})


def test_ordinary_names_stay_valid():
    cfg = config_from_dict({"name": "Digits_DDP.v2", "dataset": {"path": "d"}, "registry": {"model_name": "digits-classifier"}})
    assert cfg.name == "Digits_DDP.v2"


def test_every_home_path_is_checked():
    from core.paths import under_home

    home = Path("/srv/home")
    assert under_home(home, "runs", "abc") == home / "runs" / "abc"
    for parts in (("train", "../../x"), ("train", "/tmp/x"), ("..",), ("runs", "a/../../../etc")):
        with pytest.raises(ConfigError, match="outside TRAINFLOW_HOME"):
            under_home(home, *parts)


def test_a_malformed_set_value_exits_1_with_one_line_naming_the_key(cli_env, capsys):
    from flows.cli import main

    assert main(["run", "--config", str(DIGITS), "--set", "training.lr=["]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("trainflow: error:") and "training.lr: cannot parse '['" in err[0]


@pytest.mark.parametrize("item", ["training.lr=[", "model.channels=[1, 2", "name='x", "training.epochs={a: 1, a: 2}"])
def test_malformed_override_values_are_one_line_config_errors(item):
    key = item.partition("=")[0]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, [item])
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


@pytest.mark.parametrize("key, value", [
    ("training.lr", ".inf"), ("training.timeout_s", ".inf"), ("training.collective_timeout_s", ".inf"),
    ("training.grad_clip", ".inf"), ("training.preempt_grace_s", ".inf"), ("training.peak_tflops", ".inf"),
    ("training.straggler_ratio", ".inf"), ("gates.baseline_margin", ".inf"), ("gates.max_regression", ".nan"),
    ("gates.thresholds.accuracy", ".nan"), ("gates.thresholds.latency_p95_ms", ".inf"),
    ("retrain.psi_threshold", ".inf"), ("training.lr", "-.inf"),
])
def test_non_finite_numbers_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}: must be a finite number"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, [f"{key}={value}"])


def test_duplicate_keys_are_refused_with_their_path_and_lines(tmp_path):
    text = DIGITS.read_text()
    cfg = tmp_path / "dup.yaml"
    cfg.write_text(text.replace("  lr: 0.002", "  lr: 0.002\n  lr: 0.5", 1))
    with pytest.raises(ConfigError, match=r"dup\.yaml: training\.lr: duplicate key \(lines \d+ and \d+\)"):
        load_config(cfg)
    cfg.write_text(text + "\ntraining:\n  epochs: 1\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: training: duplicate key"):
        load_config(cfg)
    cfg.write_text("name: x\nname: y\n")
    with pytest.raises(ConfigError, match=r"dup\.yaml: name: duplicate key \(lines 1 and 2\)"):
        load_config(cfg)


def test_an_expectations_file_with_a_duplicate_key_or_nan_bound_is_refused(tmp_path):
    from core.expectations import load_expectations

    path = tmp_path / "e.yaml"
    path.write_text("version: 1\nlabel: y\nlabel: z\ncolumns:\n  - {name: y, type: integer}\n")
    with pytest.raises(ConfigError, match=r"e\.yaml: label: duplicate key"):
        load_expectations(path)
    path.write_text("version: 1\ncolumns:\n  - {name: y, type: float, min: .nan}\n")
    with pytest.raises(ConfigError, match=r"columns\.0\.min: must be a finite number"):
        load_expectations(path)


def test_data_rev_is_checked_before_git_sees_it(tmp_path):
    """A version tag's ``data_rev`` reaches ``git show``: an option there (``--output``) would write a file."""
    from core.versions import read_tracked_file

    (tmp_path / "out:data").mkdir()  # where `git show --output=<tmp>/out:data/digits.dvc` would write
    with pytest.raises(DataUnavailableError, match="data_rev must be a hex git commit sha, got '--output="):
        read_tracked_file(ROOT, "0" * 32, "train.csv", rev=f"--output={tmp_path}/out", dvc_file="data/digits.dvc",
                          path_in_repo="data/digits/train.csv")
    assert not list((tmp_path / "out:data").iterdir())


def test_a_recorded_md5_that_is_not_hex_is_refused():
    from core.versions import read_tracked_file

    with pytest.raises(DataUnavailableError, match="data_md5: must be a DVC md5"):
        read_tracked_file(ROOT, "../../../../etc/passwd", "")
