from pathlib import Path

import pytest
import yaml

from core.config import PipelineConfig, config_from_dict, load_config, parse_override
from core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml")) if not p.name.endswith(".expectations.yaml")]
TEST_CONFIGS = sorted((ROOT / "tests" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS + TEST_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_loads_and_fits_its_task(path):
    from core.expectations import load_expectations
    from tasks import task_for

    cfg = load_config(path)
    assert cfg.name
    assert len(cfg.config_id()) == 64
    task_for(cfg)
    if cfg.dataset.expectations_file:
        assert load_expectations(ROOT / cfg.dataset.expectations_file).columns


def test_negative_lr_names_key_path_and_value():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"lr": -1}})
    assert "training.lr: must be > 0, got -1" in str(err.value)


def test_keeping_one_checkpoint_is_refused_naming_the_key():
    # One kept checkpoint is the only one: unreadable after a crash, resume would start over.
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"keep_checkpoints": 1}})
    assert str(err.value) == "training.keep_checkpoints: must be >= 2, got 1"


def test_unknown_nested_key_is_rejected_with_path():
    with pytest.raises(ConfigError, match=r"model\.widht: unknown key"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "model": {"widht": 3}})


def test_every_error_is_listed():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"epochs": 0, "lr_scaling": "cubic"}})
    msg = str(err.value)
    assert "training.epochs: must be > 0, got 0" in msg
    assert "training.lr_scaling: must be one of" in msg and "'cubic'" in msg


def test_missing_name_is_reported():
    with pytest.raises(ConfigError, match="name: required key is missing"):
        config_from_dict({})


def test_inverted_bounds_are_rejected():
    with pytest.raises(ConfigError, match="dataset.expectations"):
        config_from_dict({"name": "x", "dataset": {"path": "d", "expectations": {"train_rows": [10, 5]}}})


def test_overrides_parse_yaml_values_and_apply():
    cfg = config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["training.epochs=3", "training.grad_clip=null", "model.kind=mlp"])
    assert cfg.training.epochs == 3 and cfg.training.grad_clip is None and cfg.model.kind == "mlp"
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_override_of_unknown_key_names_it():
    with pytest.raises(ConfigError, match="training.epoch: unknown key"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["training.epoch=3"])


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}}, ["training.epochs"])


def test_config_id_ignores_yaml_layout_but_not_values(tmp_path):
    a = {"name": "x", "dataset": {"path": "d"}, "seed": 1, "training": {"epochs": 2, "lr": 0.01}}
    b = {"training": {"lr": 0.01, "epochs": 2}, "seed": 1, "dataset": {"path": "d"}, "name": "x"}
    assert config_from_dict(a).config_id() == config_from_dict(b).config_id()
    assert config_from_dict(a).config_id() != config_from_dict(a, ["seed=2"]).config_id()
    # A default spelled out equals the default left implicit.
    assert config_from_dict({"name": "x", "dataset": {"path": "d"}}).config_id() == config_from_dict({"name": "x", "dataset": {"path": "d"}, "seed": 0}).config_id()


def test_yaml_round_trip_keeps_the_id():
    cfg = load_config(ROOT / "configs" / "digits.yaml")
    again = PipelineConfig.model_validate(yaml.safe_load(cfg.to_yaml()))
    assert again.config_id() == cfg.config_id()


def test_unreadable_and_invalid_yaml_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(bad)


def test_parallel_settings_are_checked_against_the_world_at_load():
    with pytest.raises(ConfigError, match=r"training\.strategy: 'single' runs one process, but training.cpu_workers is 2"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "single", "cpu_workers": 2}})
    assert config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "single", "cpu_workers": 1}}).training.strategy == "single"


def test_model_validator_errors_name_the_nested_field():
    with pytest.raises(ConfigError, match=r"dataset\.file: give either file \(split with test_fraction\) or train_file"):
        config_from_dict({"name": "x", "dataset": {"path": "d", "file": "all.csv", "train_file": "t.csv"}})
    with pytest.raises(ConfigError, match=r"dataset\.features: contains the label column 'y'"):
        config_from_dict({"name": "x", "dataset": {"path": "d", "label": "y", "features": ["a", "y"]}})


def test_loader_settings_are_checked_at_load():
    with pytest.raises(ConfigError, match=r"training\.loader\.prefetch_factor: needs num_workers > 0"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"loader": {"kind": "dataloader", "prefetch_factor": 2}}})
    with pytest.raises(ConfigError, match=r"training\.loader\.kind: 'memory' has no workers"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"loader": {"num_workers": 2}}})


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_config_that_extends_another_gives_only_what_it_changes(tmp_path):
    base = ROOT / "configs" / "digits.yaml"
    import os

    # Relative to the child's own folder; mappings merged key by key, lists and scalars replaced.
    rel = os.path.relpath(base, tmp_path / "sub")
    child = _write(tmp_path, "sub/quick.yaml", f"extends: {rel}\ntraining:\n  epochs: 2\nmodel:\n  channels: [8, 8]\n"
                   "gates:\n  thresholds: {accuracy: 0.5}\n")
    cfg, plain = load_config(child), load_config(base)
    assert cfg.training.epochs == 2 and tuple(cfg.model.channels) == (8, 8)
    assert cfg.training.lr == plain.training.lr and cfg.model.hidden == plain.model.hidden
    assert cfg.gates.thresholds["accuracy"] == 0.5
    assert cfg.gates.thresholds["macro_f1"] == plain.gates.thresholds["macro_f1"]
    # The merged config is the config: the same keys spelled out give the same id.
    spelled = load_config(base, ["training.epochs=2", "model.channels=[8, 8]", "gates.thresholds.accuracy=0.5"])
    assert cfg.config_id() == spelled.config_id()
    # --set applies on top of the merged config.
    assert load_config(child, ["training.epochs=3"]).training.epochs == 3


@pytest.mark.parametrize(("text", "words"), [
    ("extends: /etc/passwd.yaml", "extends: expected the relative path of a .yaml config"),
    ("extends: notes.txt", "extends: expected the relative path of a .yaml config"),
    ("extends: [a.yaml]", "extends: expected the relative path of a .yaml config"),
    ("extends: self.yaml", "extends: self.yaml leads back to self.yaml"),
    ("extends: missing.yaml", "extends missing.yaml: cannot read config"),
    ("extends: list.yaml", "extends list.yaml: expected a mapping, got list"),
    ("extends: bad.yaml", "extends bad.yaml: not valid YAML"),
    ("extends: a.yaml", "extends a.yaml: extends b.yaml: extends: a.yaml leads back to a.yaml"),
])
def test_a_bad_extends_is_one_line_naming_the_file(tmp_path, text, words):
    _write(tmp_path, "list.yaml", "- 1\n")
    _write(tmp_path, "bad.yaml", "name: [unclosed")
    _write(tmp_path, "a.yaml", "extends: b.yaml\n")
    _write(tmp_path, "b.yaml", "extends: a.yaml\n")
    cfg = _write(tmp_path, "self.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert str(err.value).startswith(f"{cfg}: ") and words in str(err.value) and "\n" not in str(err.value)


def test_a_chain_of_extends_deeper_than_five_is_refused(tmp_path):
    _write(tmp_path, "c0.yaml", "name: x\ndataset: {path: d}\n")
    for i in range(1, 7):
        _write(tmp_path, f"c{i}.yaml", f"extends: c{i - 1}.yaml\n")
    assert load_config(tmp_path / "c5.yaml").name == "x"
    with pytest.raises(ConfigError, match="more than 5 configs deep"):
        load_config(tmp_path / "c6.yaml")
