"""The launcher seam (training.launchers): a launcher chosen by name, the labels a cluster job carries,
and the --launcher / --nnodes inputs of the CLI and of a deployment's parameters."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from flows.cli import build_parser
from flows.params import PipelineParams, ShellInputs, from_shell, run_inputs
from training import launchers


def test_each_launcher_is_chosen_by_name_and_any_other_name_is_refused():
    assert [type(launchers.launcher_for(n)).__name__ for n in launchers.NAMES] == ["Local", "Slurm", "Kubernetes"]
    with pytest.raises(ConfigError, match=r"^--launcher: one of local, slurm, kubernetes, got 'pbs'$"):
        launchers.launcher_for("pbs")


def test_a_cluster_job_is_labelled_with_the_flow_run_and_the_mlflow_run():
    assert launchers.Labels("f-1", "abc").comment() == "flow-run=f-1,mlflow-run=abc"
    assert launchers.Labels().comment() == ""


@pytest.mark.parametrize("command", ["run", "retrain"])
def test_run_and_retrain_take_the_launcher_and_the_nodes(command):
    args = build_parser().parse_args([command, "--launcher", "slurm", "--nnodes", "2", "--nproc", "1"])
    assert (args.launcher, args.nnodes, args.nproc) == ("slurm", 2, 1)
    assert build_parser().parse_args([command]).launcher is None


def test_train_takes_the_launcher():
    args = build_parser().parse_args(["train", "--config", "c.yaml", "--out", "o", "--launcher", "slurm", "--nnodes", "2"])
    assert (args.launcher, args.nnodes) == ("slurm", "2")


def test_a_deployment_may_choose_the_launcher_and_nodes_typed_and_the_shell_is_the_fallback(tmp_path, repo_root,
                                                                                             monkeypatch):
    monkeypatch.chdir(repo_root)
    got = run_inputs(PipelineParams(config="digits.yaml", launcher="slurm", nnodes=2, nproc_per_node=1))
    assert (got.launcher, got.nnodes) == ("slurm", 2)
    assert (run_inputs(PipelineParams()).launcher, run_inputs(PipelineParams()).nnodes) == (None, None)
    for bad in ({"launcher": "ssh"}, {"nnodes": 0}, {"nnodes": 5000}):
        with pytest.raises(ValueError):
            PipelineParams(**bad)
    with from_shell(ShellInputs(tmp_path / "c.yaml", launcher="slurm", nnodes=3)):
        got = run_inputs(PipelineParams())
    assert (got.launcher, got.nnodes) == ("slurm", 3)


def test_the_kubernetes_training_folder_must_be_below_the_shared_dir_the_host_mounts(tmp_path, repo_root):
    from core.config import load_config

    def cfg(*overrides):
        return load_config(repo_root / "configs" / "digits.yaml", list(overrides))

    with pytest.raises(ConfigError, match=r"^launcher.kubernetes.shared_dir: required for --launcher kubernetes"):
        launchers.check_kube_shared_dir(cfg(), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"does not exist here; mount the volume trainflow-shared there$"):
        launchers.check_kube_shared_dir(cfg(f"launcher.kubernetes.shared_dir={tmp_path}/nosuch"), tmp_path / "run")
    shared = cfg(f"launcher.kubernetes.shared_dir={tmp_path}")
    with pytest.raises(ConfigError, match="is not inside"):
        launchers.check_kube_shared_dir(shared, tmp_path.parent / "run")
    with pytest.raises(ConfigError, match="must be a folder below"):
        launchers.check_kube_shared_dir(shared, tmp_path)
    assert launchers.check_kube_shared_dir(shared, tmp_path / "home" / "runs" / "d-1") == "home/runs/d-1"
