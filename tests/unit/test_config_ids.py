"""Config ids name champions, training folders and checkpoints: a schema change (a key moved into a
task's options model, a later key added) must leave every existing id where it was.
``tests/configs/config_ids.json`` pins them, computed before the schema was split by task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config import PipelineConfig, config_id_of, load_config
from core.config_id import _LATER

PINS = "tests/configs/config_ids.json"


def _pins(repo_root) -> dict:
    return json.loads((repo_root / PINS).read_text())


def _cases(kind: str) -> list:
    pins = json.loads((Path(__file__).resolve().parents[2] / PINS).read_text())
    return [pytest.param(p, id=f"{p['path']}{'+' + str(i) if p.get('overrides') else ''}")
            for i, p in enumerate(pins[kind])]


@pytest.mark.parametrize("pin", _cases("configs"))
def test_committed_config_keeps_its_config_and_resume_id(repo_root, pin):
    cfg = load_config(repo_root / pin["path"])
    assert (cfg.config_id(), cfg.resume_id()) == (pin["config_id"], pin["resume_id"])


@pytest.mark.parametrize("pin", _cases("variants"))
def test_config_with_later_keys_set_keeps_its_ids(repo_root, pin):
    cfg = load_config(repo_root / pin["path"], pin["overrides"])
    assert (cfg.config_id(), cfg.resume_id()) == (pin["config_id"], pin["resume_id"])


def test_every_committed_config_is_pinned(repo_root):
    pinned = {p["path"] for p in _pins(repo_root)["configs"]}
    found = {str(p.relative_to(repo_root)) for pattern in ("configs/*.yaml", "tests/configs/*.yaml",
                                                           "examples/*/configs/*.yaml")
             for p in repo_root.glob(pattern) if not p.name.endswith(".expectations.yaml")}
    new = [{"path": p, "config_id": (c := load_config(repo_root / p)).config_id(), "resume_id": c.resume_id()}
           for p in sorted(found - pinned)]
    assert not new, f"a new config: add its ids to {PINS}: {json.dumps(new)}"


def test_an_old_dumped_config_without_later_keys_has_the_same_id(repo_root):
    # A run's config.json written before a later key existed lacks it: its id must equal the id of
    # the same config loaded today, where the key is present at its default.
    defaults = PipelineConfig(name="x", dataset={"path": "d"}).model_dump(mode="json")
    for pin in _pins(repo_root)["configs"]:
        dumped = load_config(repo_root / pin["path"]).model_dump(mode="json")
        for *sections, key in _LATER:
            part, default = dumped, defaults
            for name in sections:
                part, default = part.get(name) or {}, default.get(name) or {}
            if key in part and part[key] == default.get(key):
                del part[key]
        assert config_id_of(dumped) == pin["config_id"], pin["path"]
