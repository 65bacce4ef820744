"""core/config.py holds no pipeline's defaults: what digits is lives in configs/digits.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from core.config import PipelineConfig, config_from_dict, load_config
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_a_config_of_only_the_required_keys_is_no_particular_dataset():
    cfg = config_from_dict({"name": "sales", "dataset": {"path": "data/sales"}})
    dumped = json.dumps(cfg.model_dump(mode="json"))
    assert "digits" not in dumped and "pixel" not in dumped
    assert cfg.dataset.dvc_file == "data/sales.dvc"  # what `dvc add data/sales` writes
    assert (cfg.registry.model_name, cfg.registry.experiment) == ("sales", "trainflow-sales")
    assert cfg.model.kind is None  # the task's own network, not the digits CNN
    # A registry section that names only some keys keeps the rest named after the pipeline.
    partial = config_from_dict({"name": "sales", "dataset": {"path": "d", "dvc_file": "sales.dvc"},
                                "registry": {"promotion": "manual"}})
    assert (partial.registry.model_name, partial.registry.promotion) == ("sales", "manual")
    assert partial.dataset.dvc_file == "sales.dvc"
    assert PipelineConfig(name="sales", dataset={"path": "d"}).registry.model_name == "sales"


@pytest.mark.parametrize("data, line", [
    ({"name": "x"}, "dataset: required key is missing"),
    ({"name": "x", "dataset": {}}, "dataset.path: required key is missing"),
    ({"name": "x", "dataset": {"dvc_file": "d.dvc", "label": "y"}}, "dataset.path: required key is missing"),
    ({"dataset": {"path": "d"}}, "name: required key is missing"),
    ({"name": "x", "dataset": {"path": 3}}, "dataset.path: input should be a valid string, got 3"),
])
def test_a_config_without_its_required_keys_is_one_line_naming_them(data, line):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert str(err.value) == line  # nothing about the keys made from them (dvc_file, registry)


def test_a_yaml_file_without_a_dataset_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "bare.yaml"
    path.write_text("name: bare\ntask: classification\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: dataset: required key is missing"


def test_digits_yaml_states_what_digits_is():
    raw = yaml.safe_load((ROOT / "configs" / "digits.yaml").read_text())
    stated = {(section, key) for section, keys in raw.items() if isinstance(keys, dict) for key in keys}
    assert {("dataset", "dvc_file"), ("dataset", "path"), ("dataset", "label"), ("dataset", "train_file"),
            ("dataset", "test_file"), ("model", "kind"), ("model", "channels"), ("model", "hidden"),
            ("model", "dropout"), ("registry", "model_name"), ("registry", "experiment")} <= stated
    assert "task" in raw
    cfg = load_config(ROOT / "configs" / "digits.yaml")
    assert (cfg.dataset.path, cfg.dataset.dvc_file, cfg.dataset.label) == ("data/digits", "data/digits.dvc", "label")
    assert (cfg.model.kind, cfg.model.channels, cfg.model.hidden) == ("cnn", (16, 32), 128)
    assert (cfg.registry.model_name, cfg.registry.experiment) == ("digits-classifier", "trainflow-digits")
