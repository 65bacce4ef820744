"""``training.compile``: typed at load, refused where it is not supported, outside the resume id."""

import pytest

from core.config import config_from_dict
from core.errors import ConfigError


def _cfg(training: dict):
    return config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": training})


def test_compile_true_is_short_for_enabled_with_torch_defaults():
    c = _cfg({"compile": True}).training.compile
    assert (c.enabled, c.mode, c.backend) == (True, "default", "inductor")
    assert _cfg({}).training.compile.enabled is False
    c = _cfg({"compile": {"enabled": True, "mode": "max-autotune", "backend": "aot_eager"}}).training.compile
    assert (c.mode, c.backend) == ("max-autotune", "aot_eager")


def test_bad_compile_values_name_the_key_path():
    with pytest.raises(ConfigError, match=r"training\.compile\.mode: must be one of"):
        _cfg({"compile": {"enabled": True, "mode": "fast"}})
    with pytest.raises(ConfigError, match=r"training\.compile\.fullgrap: unknown key"):
        _cfg({"compile": {"fullgrap": True}})


@pytest.mark.parametrize("strategy", ["tp", "pp", "hybrid"])
def test_compile_with_model_parallel_is_refused_at_load(strategy):
    with pytest.raises(ConfigError, match=rf"training\.compile: supported with strategy single, ddp, fsdp or auto, "
                                          rf"not '{strategy}'"):
        _cfg({"strategy": strategy, "compile": True})


def test_compile_keeps_the_config_id_when_off_and_the_resume_id_always():
    off, on = _cfg({}), _cfg({"compile": True})
    assert "compile" in off.model_dump(mode="json")["training"]
    # Configs hashed before the key existed keep their id while it holds its default.
    assert off.config_id() == _cfg({"compile": False}).config_id()
    assert on.config_id() != off.config_id()
    # Compiling changes how the step runs, not what is learned: a checkpoint resumes across it.
    assert on.resume_id() == off.resume_id()

