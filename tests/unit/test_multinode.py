"""Elastic node ranges and multi-node launch settings, checked before anything starts; what a node
without rank 0's folder records. (The jobs themselves: tests/integration/test_multinode.py and
tests/fault/test_elastic.py.)"""

from __future__ import annotations

import os

import pytest

from core.config import load_config
from core.errors import ConfigError
from training import multinode
from training.launcher import NNODES_ENV, make_spec, parse_nnodes
from training.plan import HostFacts, plan_launch

ENDPOINT = dict(rdzv_endpoint="127.0.0.1:29400", rdzv_id="0123456789abcdef")


@pytest.fixture
def cfg(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    return lambda *overrides: load_config(repo_root / "configs" / "digits.yaml", list(overrides))


@pytest.mark.parametrize("text, expected", [("2", (2, 2)), (3, (3, 3)), ("1:2", (1, 2)), (" 2:4 ", (2, 4)),
                                            ("2:2", (2, 2))])
def test_nnodes_is_n_or_a_min_max_range(text, expected):
    assert parse_nnodes(text) == expected


@pytest.mark.parametrize("text, words", [("0", "1 <= MIN <= MAX"), ("2:1", "1 <= MIN <= MAX"), ("0:2", "1 <= MIN"),
                                         ("two", "N or MIN:MAX"), ("1:2:3", "N or MIN:MAX"), ("-1", "N or MIN:MAX"),
                                         ("", "N or MIN:MAX"), ("1.5", "N or MIN:MAX")])
def test_a_bad_node_count_names_the_option(text, words):
    with pytest.raises(ConfigError, match="^--nnodes: ") as err:
        parse_nnodes(text)
    assert words in str(err.value)


def test_an_elastic_job_gives_torchrun_its_range_and_rendezvous_settings(cfg, repo_root, tmp_path):
    plan = plan_launch(cfg("training.rendezvous.last_call_s=7"), HostFacts(), 1, "1:2")
    spec = make_spec(plan, tmp_path / "out", repo_root, "md5", **ENDPOINT)
    cmd = spec.command(tmp_path / "logs")
    assert spec.nnodes == "1:2" and spec.node_range == (1, 2)
    assert "--nnodes=1:2" in cmd and "--rdzv-backend=c10d" in cmd and "--standalone" not in cmd
    assert "--rdzv-conf=join_timeout=600,last_call_timeout=7,keep_alive_interval=5,keep_alive_max_attempt=3" in cmd
    # A range of one size is a fixed count; one node on its own keeps torchrun's standalone rendezvous.
    assert make_spec(plan_launch(cfg(), HostFacts(), 1, "2:2"), tmp_path / "o2", repo_root, "md5",
                     **ENDPOINT).nnodes == 2
    alone = make_spec(plan_launch(cfg(), HostFacts(), 1, "1"), tmp_path / "o3", repo_root, "md5")
    alone = alone.command(tmp_path / "logs")
    assert "--standalone" in alone and not any(a.startswith("--rdzv-conf") for a in alone)


def test_an_elastic_job_without_restarts_is_refused_naming_the_key(cfg, repo_root, tmp_path):
    with pytest.raises(ConfigError, match=r"--nnodes 1:2: an elastic job needs training.max_restarts >= 1"):
        make_spec(plan_launch(cfg("training.max_restarts=0"), HostFacts(), 1, "1:2"), tmp_path / "out", repo_root,
                  "md5", **ENDPOINT)
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_every_world_of_an_elastic_range_must_fit_the_strategy(cfg, repo_root, tmp_path):
    # 'single' fits a world of 1 (one node) but not of 2 (both nodes present).
    with pytest.raises(ConfigError, match="'single' runs one process"):
        plan_launch(cfg("training.strategy=single", "training.cpu_workers=1"), HostFacts(), 1, "1:2")


def test_rendezvous_settings_are_checked_at_load_and_leave_the_config_id_alone(cfg):
    with pytest.raises(ConfigError, match=r"training\.rendezvous\.last_call_s: must be > 0, got 0"):
        cfg("training.rendezvous.last_call_s=0")
    with pytest.raises(ConfigError, match=r"training\.rendezvous\.heartbeat_s: unknown key"):
        cfg("training.rendezvous.heartbeat_s=2")
    default = cfg()
    assert default.training.rendezvous.keep_alive_s == 5
    # Configs hashed before these keys existed keep their id while the keys hold their defaults.
    from core.config import config_id_of

    dumped = default.model_dump(mode="json")
    del dumped["training"]["rendezvous"]
    assert config_id_of(dumped) == default.config_id() != cfg("training.rendezvous.last_call_s=5").config_id()


def test_a_node_copy_holds_the_outcome_but_not_the_weights(monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "1")
    rank0 = {"status": "completed", "world_size": 2, "weights_sha256": "ab", "weights": "weights.pt",
             "model_pt2": "model.pt2", "rank0": {"host": "a", "out_dir": "/data/run"}}
    copy = multinode.node_copy(rank0)
    assert copy["status"] == "completed" and copy["weights_sha256"] == "ab" and copy["rank0"] == rank0["rank0"]
    assert "weights" not in copy and "model_pt2" not in copy and copy["node_copy"]["group_rank"] == 1


@pytest.mark.parametrize("nnodes, restarts, checkpoints, needed", [
    ("2", 3, True, True), ("2", 0, True, False), ("1:2", 0, True, True), ("2", 3, False, False)])
def test_a_shared_out_is_needed_where_a_restart_resumes(cfg, monkeypatch, nnodes, restarts, checkpoints, needed):
    monkeypatch.setenv(NNODES_ENV, nnodes)
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)  # outside torchrun: the config's
    c = cfg(f"training.max_restarts={restarts}", f"training.checkpoints={str(checkpoints).lower()}")
    assert multinode.needs_shared_out(c) is needed


def test_the_agent_gives_each_c10d_round_a_fresh_store(monkeypatch):
    from training.agent import _fresh_store_per_round

    key = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    monkeypatch.setenv(key, "0")
    monkeypatch.delenv(key)  # recorded, so the value set below is undone after the test
    _fresh_store_per_round(["--nnodes=1", "--standalone"])
    assert key not in os.environ
    _fresh_store_per_round(["--nnodes=1:2", "--rdzv-backend=c10d"])
    assert os.environ[key] == "1"


def test_cpu_jobs_fork_their_workers_from_the_agent_and_other_commands_are_left_to_torchrun(cfg, repo_root,
                                                                                              tmp_path, monkeypatch):
    import torch.distributed.run as run

    from training import agent

    spec = make_spec(plan_launch(cfg(), HostFacts(), 2), tmp_path / "out", repo_root, "md5")
    assert spec.fork_workers  # no GPU here: the job is a CPU one
    monkeypatch.setattr(run, "config_from_args", run.config_from_args)  # put back after the test
    agent._fork_workers()
    forked_config, entry, entry_args = run.config_from_args(
        run.parse_args(spec.command(tmp_path / "logs")[3:]))
    assert forked_config.start_method == "fork" and entry is agent._forked_worker
    assert entry_args[:3] == ["training.worker", "--config", spec.config_path]
    # A script (not -m MODULE) is started the way torchrun starts it.
    plain_config, cmd, cmd_args = run.config_from_args(run.parse_args(["--standalone", "x.py", "--a"]))
    assert plain_config.start_method == "spawn" and isinstance(cmd, str) and cmd_args[-2:] == ["x.py", "--a"]
