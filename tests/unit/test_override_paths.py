"""A path from an override (``--set``, a run's overrides) resolves inside the repository, or the
config is refused with one line naming the key, before anything opens the path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.config import load_config
from core.errors import ConfigError
from core.override_paths import PATH_KEYS
from flows.params import KNOBS

ROOT = Path(__file__).resolve().parents[2]
CONFIG_OF = {"dataset.text": ROOT / "configs" / "stdlib-lm.yaml", "dataset.images": ROOT / "configs" / "digit-images.yaml"}


# What a key needs beside it to be a valid config.
BESIDE = {"dataset.file": ["dataset.train_file=null", "dataset.test_file=null"]}


def config_for(key: str) -> Path:
    """A committed config where ``key`` means something (its task reads it)."""
    return next((c for prefix, c in CONFIG_OF.items() if key.startswith(prefix + ".")), ROOT / "configs" / "digits.yaml")


@pytest.mark.parametrize("key", list(PATH_KEYS))
@pytest.mark.parametrize("value", ["/etc/passwd", "../../../../../../../../etc/passwd"])
def test_each_path_key_refuses_a_value_outside_the_repository(key, value):
    with pytest.raises(ConfigError) as err:
        load_config(config_for(key), [*BESIDE.get(key, []), f"{key}={value}"])
    line = str(err.value)
    assert line.splitlines() == [line]
    assert f"{key}: {value!r} resolves outside the repository {ROOT}" in line


@pytest.mark.parametrize("key", list(PATH_KEYS))
def test_each_path_key_takes_a_path_inside_the_repository(key):
    cfg = load_config(config_for(key), [*BESIDE.get(key, []), f"{key}=some/where/inside"])
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    assert obj == "some/where/inside"


def test_the_file_named_is_never_read_into_the_error(tmp_path):
    secret = tmp_path / "secret.yaml"
    secret.write_text("root:x:0:0:the-secret-line\n")
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "digits.yaml", [f"dataset.expectations_file={secret}"])
    assert "the-secret-line" not in str(err.value) and "dataset.expectations_file" in str(err.value)


def test_a_section_set_as_a_mapping_is_checked_too():
    with pytest.raises(ConfigError, match=r"dataset\.path: '/etc' resolves outside"):
        load_config(ROOT / "configs" / "digits.yaml", ["dataset={path: /etc, expectations_file: x.yaml}"])


def test_a_symlink_leading_out_counts_as_outside(tmp_path):
    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "configs").mkdir()
    shutil.copy(ROOT / "configs" / "digits.yaml", repo / "configs" / "digits.yaml")
    (repo / "data").mkdir()
    (repo / "data" / "out").symlink_to(tmp_path.parent)
    (repo / "data" / "in").symlink_to(repo / "configs")
    cfg = repo / "configs" / "digits.yaml"
    with pytest.raises(ConfigError, match=r"dataset\.path: 'data/out' resolves outside the repository"):
        load_config(cfg, ["dataset.path=data/out"])
    with pytest.raises(ConfigError, match=r"dataset\.train_file: 'out/x.csv' resolves outside"):
        load_config(cfg, ["dataset.path=data", "dataset.train_file=out/x.csv"])
    assert load_config(cfg, ["dataset.path=data/in"]).dataset.path == "data/in"


def test_an_override_of_another_key_leaves_the_committed_paths_alone(tmp_path):
    """The committed config's paths are its reviewer's: only what an override sets is checked."""
    repo = tmp_path / "repo"
    (repo / ".dvc").mkdir(parents=True)
    (repo / "c.yaml").write_text(f"name: outside\ndataset:\n  path: {tmp_path / 'elsewhere'}\n"
                                 "  expectations_file: e.yaml\n")
    assert load_config(repo / "c.yaml", ["training.epochs=2"]).dataset.path == str(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"dataset\.train_file: 'x.csv' resolves outside"):
        load_config(repo / "c.yaml", ["dataset.train_file=x.csv"])  # under the outside dataset.path


def test_no_deployment_parameter_sets_a_path():
    assert not set(KNOBS.values()) & set(PATH_KEYS)
