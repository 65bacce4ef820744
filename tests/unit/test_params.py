"""A deployment's parameters are a narrow, typed surface; the CLI's inputs travel apart from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.errors import ConfigError
from flows.params import (KNOBS, PipelineParams, RetrainParams, ShellInputs, config_file, from_shell,
                          run_inputs)

ROOT = Path(__file__).resolve().parents[2]


def test_each_knob_becomes_one_override_of_its_config_key():
    p = PipelineParams(epochs=3, lr=0.01, batch_size=16, seed=7, strategy="single", promotion="manual")
    assert p.overrides() == ["training.epochs=3", "training.lr=0.01", "training.batch_size=16", "seed=7",
                             "training.strategy=single", "registry.promotion=manual"]
    assert PipelineParams().overrides() == []
    assert set(KNOBS) | {"config", "nproc_per_node", "promotion", "launcher", "nnodes"} == set(PipelineParams.model_fields)


@pytest.mark.parametrize("key, value", [
    ("overrides", ["dataset.path=/etc", "dataset.train_file=passwd"]),
    ("config_path", "/etc/passwd"),
    ("dataset", {"path": "/etc"}),
    ("name", "../../x"),
    ("gates", {"thresholds": {}}),
    ("registry", {"model_name": "other-teams-model"}),
    ("task", "mine"),
    ("model", {"factory": "os:system"}),
    ("image", "evil:latest"),
])
def test_anything_but_a_knob_is_refused_naming_the_key(key, value):
    with pytest.raises(ValidationError) as err:
        PipelineParams.model_validate({key: value})
    assert f"{key}: not a run parameter" in str(err.value)
    with pytest.raises(ValidationError, match=key):
        RetrainParams.model_validate({"force": True, key: value})


@pytest.mark.parametrize("name", ["../configs/digits.yaml", "/etc/passwd.yaml", "configs/digits.yaml",
                                  "..yaml", "digits.txt", ".hidden.yaml", ""])
def test_config_is_a_file_name_in_configs_never_a_path(name):
    with pytest.raises(ValidationError, match="config"):
        PipelineParams(config=name)
    with pytest.raises(ConfigError, match="config: must be a file name in configs/"):
        config_file(name, ROOT)


@pytest.mark.parametrize("field, value", [("promotion", "auto"), ("lr", float("inf")), ("lr", float("nan")),
                                          ("epochs", 0), ("nproc_per_node", 0), ("nproc_per_node", 10_000),
                                          ("seed", -1), ("strategy", "mine")])
def test_knob_values_are_typed_and_bounded(field, value):
    with pytest.raises(ValidationError, match=field):
        PipelineParams.model_validate({field: value})


def test_the_form_schema_is_closed_and_every_field_is_described():
    schema = PipelineParams.model_json_schema()
    assert schema["additionalProperties"] is False
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_a_config_symlinked_out_of_configs_or_missing_is_refused(tmp_path):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "configs").mkdir()
    outside = tmp_path / "outside.yaml"
    outside.write_text("name: x\n")
    (tmp_path / "configs" / "link.yaml").symlink_to(outside)
    (tmp_path / "configs" / "ok.yaml").write_text("name: ok\n")
    assert config_file("ok.yaml", tmp_path) == tmp_path / "configs" / "ok.yaml"
    with pytest.raises(ConfigError, match="config: 'link.yaml' is not a config file in"):
        config_file("link.yaml", tmp_path)
    with pytest.raises(ConfigError, match="config: 'nope.yaml' is not a config file in"):
        config_file("nope.yaml", tmp_path)


def test_a_deployment_run_reads_only_configs_and_its_knobs(monkeypatch):
    monkeypatch.chdir(ROOT)
    got = run_inputs(PipelineParams(config="wine.yaml", epochs=2, nproc_per_node=1))
    assert got.config_path == ROOT / "configs" / "wine.yaml"
    assert got.overrides == ("training.epochs=2",) and got.nproc_per_node == 1
    assert got.image is None and got.image_digest is None  # the worker's environment says which image


def test_the_shell_channel_is_trusted_only_inside_the_cli_block(tmp_path, monkeypatch):
    shell = ShellInputs(tmp_path / "my.yaml", ("dataset.path=data/mine", "registry.promotion=auto"), 3,
                        "img:1", "sha256:" + "a" * 64)
    params = PipelineParams(seed=5)
    with from_shell(shell):
        got = run_inputs(params)
        assert got.config_path == tmp_path / "my.yaml" and got.nproc_per_node == 3
        assert got.overrides == ("dataset.path=data/mine", "registry.promotion=auto", "seed=5")
        assert (got.image, got.image_digest) == ("img:1", "sha256:" + "a" * 64)
    monkeypatch.chdir(tmp_path)  # outside the block the params alone decide: configs/ of the cwd's project
    with pytest.raises(ConfigError, match="config: 'digits.yaml' is not a config file in"):
        run_inputs(params)
    with pytest.raises(ConfigError, match="model.factory: names code to run"):
        with from_shell(ShellInputs(tmp_path / "my.yaml", ("model.factory=os:system",))):
            pass


def test_the_flow_itself_refuses_parameters_its_schema_does_not_allow():
    """A deployment registered without enforce_parameter_schema still fails in the flow run, before its body."""
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import pipeline

    with pytest.raises(ParameterTypeError, match="overrides"):
        pipeline.validate_parameters({"params": {"overrides": ["dataset.path=/etc"]}})
    ok = pipeline.validate_parameters({"params": {"config": "wine.yaml", "epochs": 2}})
    assert ok["params"].overrides() == ["training.epochs=2"]
