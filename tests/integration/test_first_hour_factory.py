"""The ``model.factory`` example of docs/data.md ("Your own model"), run as written: a module in a fresh project's root
(no PYTHONPATH, no install) trains through the real flow in two torchrun workers and is
registered; a misspelt function in the same config fails at load with one line."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.conftest import DVC_BIN, run
from tests.integration.test_bring_your_own import BOUNDS, commit_all, trainflow

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

def factory_example() -> tuple[dict, str, str]:
    """(the yaml block, the python block, its path) of docs/data.md's ``<!-- factory:start ... -->`` block."""
    text = (ROOT / "docs" / "data.md").read_text()
    block = text.split("<!-- factory:start", 1)[1].split("-->", 1)[1].split("<!-- factory:end -->", 1)[0]
    config = yaml.safe_load(block.split("```yaml\n", 1)[1].split("```", 1)[0])
    code = block.split("```python\n", 1)[1].split("```", 1)[0]
    path = re.match(r"# (\S+\.py)\n", code).group(1)  # the block names its file on its first line
    return config, code, path


def table(n: int, seed: int) -> pd.DataFrame:
    """Four float features, two string classes a line separates: a few epochs learn it."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(rng.normal(0, 1, (n, 4)), columns=["a", "b", "c", "d"])
    df["kind"] = np.where(df.a + 0.5 * df.b > 0, "up", "down")
    return df


def test_the_documented_factory_example_trains_in_the_workers_and_a_typo_fails_at_load(tmp_path):
    from flows.init import init_project

    config, code, path = factory_example()
    module, _, function = config["model"]["factory"].partition(":")
    assert path == module.replace(".", "/") + ".py"  # the file the factory names
    proj = tmp_path / "proj"
    (proj / "data" / "tiny").mkdir(parents=True)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    (proj / ".gitignore").write_text(".trainflow/\n")
    table(400, 0).to_csv(proj / "data" / "tiny" / "tiny.csv", index=False)
    init_project(proj, "data/tiny", "kind")
    cfg_file = proj / "configs" / "tiny.yaml"
    raw = yaml.safe_load(cfg_file.read_text())
    raw["model"] = config["model"]  # "replace the model: section"
    cfg_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    (proj / path).parent.mkdir(parents=True, exist_ok=True)
    (proj / path).write_text(code)
    commit_all(proj, "tiny + my model")

    code_, s, err = trainflow(proj, "run", "--config", "configs/tiny.yaml", *BOUNDS, "--set", "training.epochs=2")
    assert code_ == 0, (s.get("error"), err[-3000:])
    assert s["status"] == "registered" and s["training"]["world_size"] == 2
    # The workers built the user's network: the registered weights hold its layers, shape for shape.
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("readme_factory", proj / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    theirs = getattr(mod, function)(4, 2, **config["model"].get("kwargs", {})).state_dict()
    (weights,) = (proj / ".trainflow").glob("train/*/weights.pt")
    ours = torch.load(weights, weights_only=True)
    for key, tensor in theirs.items():
        assert any(k.endswith("." + key) and v.shape == tensor.shape for k, v in ours.items()), key

    # A misspelt function in the same committed config: one line at load, before Prefect or torchrun.
    shutil.rmtree(proj / ".trainflow" / "train")
    cfg_file.write_text(cfg_file.read_text().replace(f":{function}", f":{function}x"))
    code_, s, err = trainflow(proj, "run", "--config", "configs/tiny.yaml", *BOUNDS)
    assert code_ == 1 and s["status"] == "config_error"
    assert err.strip().splitlines()[-1] == (f"trainflow: error: model.factory: {module} has no function "
                                            f"'{function}x' (did you mean {function}?)")
    assert not (proj / ".trainflow" / "train").exists()
