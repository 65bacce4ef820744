"""A newcomer's first hour: --version, the top-level help, did-you-mean for a misspelt key,
k8s-job refusing a bad config before printing, the curves PNG. (What `make` says:
tests/integration/test_make_targets.py.)"""

from __future__ import annotations

import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest

from core.config import config_from_dict, load_config
from core.errors import ConfigError
from flows.cli import EXIT_CODES, main

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "a" * 64
K8S = ["k8s-job", "--nnodes", "2", "--gpus-per-node", "1", "--image", f"repo/trainflow@{DIGEST}",
       "--git-repo", "https://git.example/trainflow.git", "--git-ref", "abc123", "--mlflow-uri", "http://mlflow:5000"]


@pytest.fixture
def saved_env(tmp_path, monkeypatch):
    """The CLI sets offline defaults in os.environ: give them back, and keep its state in tmp_path."""
    saved = dict(os.environ)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_version_prints_the_installed_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out, err = capsys.readouterr()
    assert out == f"trainflow {version('trainflow')}\n" and err == ""


def test_top_level_help_shows_what_it_is_the_commands_and_every_exit_code(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and "the command line." not in out  # not the module's docstring
    assert "One Prefect flow from DVC-tracked data" in out
    for command in ("run", "train", "retrain", "reproduce", "scale", "k8s-job", "init"):
        assert re.search(rf"^\s+{re.escape(command)}\s", out, re.M), command
    codes = out.split("exit codes:\n", 1)[1]
    assert [int(line.split()[0]) for line in codes.splitlines() if line.strip()] == [c for c, _ in EXIT_CODES]
    assert [c for c, _ in EXIT_CODES] == [*range(7), 64]
    assert "command line" in dict(EXIT_CODES)[64] and "command line" not in dict(EXIT_CODES)[2]


@pytest.mark.parametrize("argv", [["bogus"], ["run", "--nproc", "x"], ["train", "--config", "c.yaml"],
                                  ["run", "--promotion", "sometimes"], ["reproduce"], ["k8s-job", "--nnodes", "2"],
                                  ["--no-such-option"]])
def test_a_bad_command_line_exits_64_not_2_which_means_the_data_failed(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 64
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: trainflow") and "error: " in err.splitlines()[-1]


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), (" On ", True),
                                       ("0", False), ("false", False), ("no", False), ("off", False), ("", False)])
def test_trainflow_debug_is_on_only_for_1_true_yes_on_and_prints_only_a_real_traceback(value, on, monkeypatch,
                                                                                      capsys):
    from flows.cli import _fail

    monkeypatch.setenv("TRAINFLOW_DEBUG", value)
    assert _fail("no exception here", 3) == 3  # outside any except block: never "NoneType: None"
    assert capsys.readouterr().err == "trainflow: error: no exception here\n"
    try:
        raise ConfigError("model.factory: bad")
    except ConfigError as exc:
        caught = exc
    assert _fail(str(caught), 1, caught) == 1  # passed in, after its except block has ended
    err = capsys.readouterr().err
    assert err.startswith("trainflow: error: model.factory: bad\n")
    assert ("Traceback (most recent call last)" in err and "ConfigError: model.factory: bad" in err) is on
    assert "NoneType: None" not in err
    if not on:
        assert err == "trainflow: error: model.factory: bad\n"


def test_a_failed_run_passes_its_exception_to_the_debug_traceback(saved_env, monkeypatch, capsys):
    """`run` prints its error after the flow's except block: the traceback must be the flow's."""
    monkeypatch.setenv("TRAINFLOW_DEBUG", "1")
    assert main(["run", "--set", "training.epoch=3"]) == 1
    err = capsys.readouterr().err
    assert "NoneType: None" not in err and "Traceback (most recent call last)" in err
    assert err.rstrip().endswith("training.epoch: unknown key (did you mean training.epochs?)")


def test_a_misspelt_override_key_suggests_the_real_one():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["training.epoch=3"])
    assert str(err.value) == "training.epoch: unknown key (did you mean training.epochs?)"
    with pytest.raises(ConfigError, match=r"^trainig: unknown key \(did you mean training\?\)$"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["trainig.epochs=3"])
    with pytest.raises(ConfigError, match=r"^training\.early_stopping\.patiense: unknown key "
                                          r"\(did you mean training\.early_stopping\.patience\?\)$"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["training.early_stopping.patiense=2"])
    with pytest.raises(ConfigError) as err:  # nothing close: no guess
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["nope=1"])
    assert str(err.value) == "nope: unknown key"


def test_a_misspelt_yaml_key_names_the_file_the_path_and_the_suggestion(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: x\ntraining:\n  epochs: 2\n  weight_decy: 0.01\nmodel:\n  hiden: 64\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{cfg}: ")
    assert "model.hiden: unknown key (did you mean model.hidden?)" in msg
    assert "training.weight_decy: unknown key (did you mean training.weight_decay?)" in msg


def test_run_with_a_misspelt_key_exits_1_with_the_suggestion(saved_env, capsys):
    assert main(["run", "--set", "training.epoch=3"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("trainflow: error: ") and "digits.yaml: " in err
    assert err.endswith("training.epoch: unknown key (did you mean training.epochs?)\n")
    assert len(err.splitlines()) == 1


def test_k8s_job_refuses_a_bad_config_before_printing_any_yaml(capsys):
    assert main([*K8S, "--set", "nope=1"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("trainflow: error: ") and err.rstrip().endswith("nope: unknown key")
    assert len(err.splitlines()) == 1
    assert main([*K8S, "--set", "training.epochs=3"]) == 0  # a good one still prints the manifests
    assert "kind: Job" in capsys.readouterr().out


def test_curves_png_is_a_png_with_both_panels(tmp_path):
    from PIL import Image

    from evaluation.curves import curves_png

    history = [{"epoch": e, "train_loss": 2.0 / e, "val_loss": 2.2 / e, "val_accuracy": 1 - 0.5 / e,
                "samples_per_s": 1000.0} for e in range(1, 7)]
    path = curves_png(history, tmp_path / "plots" / "curves.png", "digits: training curves")
    body = path.read_bytes()
    assert body.startswith(b"\x89PNG\r\n\x1a\n") and len(body) > 1000
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        both = img.size
    # No accuracy (a regression task): only the loss panel, so a narrower picture.
    no_acc = [{**h, "val_accuracy": None} for h in history]
    with Image.open(curves_png(no_acc, tmp_path / "loss.png", "loss only")) as img:
        assert img.size[1] == both[1] and img.size[0] * 2 == both[0]
    # Each series' colour is drawn: train (blue) and validation (orange).
    from evaluation.curves import TRAIN, VAL

    with Image.open(path) as img:
        colours = {c for _, c in img.convert("RGB").getcolors(maxcolors=1 << 16)}
    assert TRAIN in colours and VAL in colours
    with pytest.raises(ValueError, match="no epochs"):
        curves_png([], tmp_path / "empty.png", "nothing")


def test_the_summary_names_the_curves_png(capsys):
    from flows.cli import _print_summary

    _print_summary({"status": "registered", "plots": {"training_curves": "/state/runs/abc/plots/training_curves.png"}})
    err = capsys.readouterr().err
    assert "curves" in err and "training_curves.png" in err


def test_init_help_says_what_init_does_and_the_real_defaults(capsys):
    """The first-hour report: `init --help` had no description and said `--test-fraction` defaulted
    to "the config's" (it is 0.2)."""
    with pytest.raises(SystemExit) as done:
        main(["init", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Track a CSV or Parquet table with DVC" in out and "After a schema change" in out
    assert "default 0.2" in " ".join(out.split()) and "the config's)" not in out.split("--test-fraction")[-1][:40]
    assert "--force" not in out  # a re-run updates the config and keeps the user's keys: nothing to force
