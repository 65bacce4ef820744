"""The build step that stops `prefect deploy` when a deployment's `{{ $VAR }}` is unset."""

from __future__ import annotations

import pytest

from flows.deploy_steps import require_env


def test_an_unset_or_blank_variable_stops_the_deploy_with_one_line_naming_it_and_the_deployment(monkeypatch, capsys):
    monkeypatch.delenv("TF_TEST_REPO", raising=False)
    monkeypatch.setenv("TF_TEST_SHA", "  ")
    monkeypatch.setenv("TF_TEST_IMAGE", "registry.example/x@sha256:00")
    with pytest.raises(SystemExit) as exit_:
        require_env("train-gpu-k8s", ["TF_TEST_REPO", "TF_TEST_IMAGE", "TF_TEST_SHA"])
    assert exit_.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: prefect deploy train-gpu-k8s: TF_TEST_REPO, TF_TEST_SHA are not set")
    assert "{{ $TF_TEST_REPO }}" in line and "TF_TEST_IMAGE" not in line


def test_every_variable_set_lets_the_deploy_go_on(monkeypatch, capsys):
    monkeypatch.setenv("TF_TEST_REPO", "/srv/trainflow")
    assert require_env("train", ["TF_TEST_REPO"]) == {}
    assert capsys.readouterr().err == ""
