"""prefect.yaml's `train` deployment points at the flow, whose parameter is one typed model."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.integration


def test_train_deployment_entrypoint_loads_with_typed_form(repo_root, monkeypatch):
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    spec = yaml.safe_load((repo_root / "prefect.yaml").read_text())
    train = next(d for d in spec["deployments"] if d["name"] == "train")
    assert train["work_pool"]["name"] == "process"
    monkeypatch.chdir(repo_root)
    flow = load_flow_from_entrypoint(train["entrypoint"])
    assert flow.name == "trainflow-pipeline"
    schema = parameter_schema(flow).model_dump()
    props = schema["definitions"]["PipelineParams"]["properties"]
    # A narrow form: a config by name and typed knobs, each described; no paths, overrides or image.
    assert set(props) == {"config", "epochs", "lr", "batch_size", "seed", "strategy", "nproc_per_node", "promotion",
                          "launcher", "nnodes"}
    assert props["launcher"]["anyOf"][0]["enum"] == ["local", "slurm", "kubernetes"]  # a choice, not a free string
    assert props["config"]["default"] == "digits.yaml"
    assert all(p.get("description") for p in props.values())
    steps = [next(iter(s)) for s in spec["pull"]]
    assert steps[-1] == "prefect.deployments.steps.run_shell_script"
