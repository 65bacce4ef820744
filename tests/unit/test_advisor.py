"""The launch plan on given host facts (``training.plan.plan_launch``) and its rules for auto:
memory, strategy choice, layout choice."""

from pathlib import Path

import pytest

from core.config import config_from_dict, load_config
from core.errors import ConfigError
from training import plan as advisor
from training.plan import (HostFacts, choose_layout, choose_strategy, default_layout, estimate_memory, plan_launch,
                           recommendation)

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "configs" / "digits.yaml"
GB = 10**9


def _mem(param=1 * GB, act=0.5 * GB, largest=0.1 * GB):
    """Raw sizes as estimate_memory returns them (AdamW: optimizer = 2 x params)."""
    return {"param_bytes": param, "grad_bytes": param, "optim_bytes": 2 * param,
            "activation_bytes": act, "largest_layer_param_bytes": largest}


def _row(nproc, threads, sps, ttt=None, batch=32):
    return {"layout": f"{nproc}x{threads}", "nproc": nproc, "threads": threads, "batch_size": batch,
            "samples_per_s": sps, "time_to_target_s": ttt}


# -- memory ---------------------------------------------------------------------------------
def test_estimate_memory_follows_the_documented_rules():
    cfg = load_config(DIGITS, ["model.kind=mlp", "model.hidden=10", "training.batch_size=4"])
    mem = estimate_memory(cfg, 2)
    # 64->10, 10->10, 10->10 linear layers: 650 + 110 + 110 parameters.
    assert mem["n_params"] == 870 and mem["param_bytes"] == 4 * 870 == mem["grad_bytes"]
    assert mem["optim_bytes"] == 2 * mem["param_bytes"]  # AdamW: exp_avg + exp_avg_sq
    # Leaf outputs per sample: scale 64, linear 10, relu 10, dropout 10, linear 10, relu 10, linear 10.
    assert mem["activation_bytes"] == 4 * (64 + 6 * 10) * 4
    assert mem["ddp_total_bytes"] == 4 * 870 * 4 + mem["activation_bytes"]
    assert mem["fsdp_state_bytes"] == 4 * 870 * 4 // 2 + 4 * 650  # half the state + the largest layer
    sgd = estimate_memory(load_config(DIGITS, ["training.optimizer=sgd"]), 1)
    assert sgd["optim_bytes"] == sgd["param_bytes"]  # momentum only


# -- strategy ---------------------------------------------------------------------------------
def test_one_rank_is_single():
    strategy, reason = choose_strategy(_mem(), 16 * GB, 1)
    assert strategy == "single" and "4.5 GB" in reason


def test_replica_that_fits_is_ddp():
    strategy, reason = choose_strategy(_mem(), 16 * GB, 4)
    assert strategy == "ddp"
    assert "4.5 GB" in reason and "12.8 GB" in reason  # the need and 80% of 16 GB


def test_only_the_sharded_state_fits_is_fsdp():
    # Replica: 4 GB state + 0.5 GB activations = 4.5 GB > 0.8 x 5 GB; sharded over 4: 1 + 0.1 + 0.5.
    strategy, reason = choose_strategy(_mem(), 5 * GB, 4)
    assert strategy == "fsdp" and "1.6 GB" in reason and "4.5 GB" in reason


def test_nothing_fits_names_the_sizes():
    with pytest.raises(ConfigError) as err:
        choose_strategy(_mem(), 1 * GB, 2)
    msg = str(err.value)
    assert msg.startswith("training.strategy: auto: nothing fits")
    assert "4.5 GB" in msg and "2.6 GB" in msg and "800.0 MB" in msg
    with pytest.raises(ConfigError, match="one device has"):
        choose_strategy(_mem(), 1 * GB, 1)


# -- layouts ----------------------------------------------------------------------------------
def test_time_to_target_wins_over_throughput():
    rows = [_row(1, 2, 3000, ttt=4.0), _row(2, 1, 5000, ttt=6.0), _row(1, 1, 2000, ttt=None)]
    best = choose_layout(rows)
    assert (best["nproc"], best["threads"], best["metric"]) == (1, 2, "time_to_target_s")
    assert "reached the target in 4.00 s" in best["reason"]


def test_throughput_decides_when_no_layout_reaches_the_target():
    best = choose_layout([_row(1, 2, 3000), _row(2, 1, 5000), _row(1, 1, 2000)])
    assert (best["nproc"], best["metric"]) == (2, "samples_per_s")
    assert "5,000 samples/s" in best["reason"]


def test_a_tie_goes_to_fewer_processes():
    best = choose_layout([_row(2, 1, 3000), _row(1, 2, 3000), _row(4, 1, 2990)])
    assert (best["nproc"], best["threads"]) == (1, 2)
    assert "fewer processes" in best["reason"]
    best = choose_layout([_row(2, 1, 100, ttt=5.0), _row(1, 2, 90, ttt=5.0)])
    assert best["nproc"] == 1


def test_recommendation_says_when_fewer_workers_win():
    text = recommendation([_row(1, 2, 3200), _row(1, 1, 1900), _row(2, 1, 2000)])
    assert text.startswith("1 process x 2 threads is 1.6x faster (samples/s) than 2 DDP processes x 1 thread")
    assert "use it" in text and "Fewer workers win" in text
    more = recommendation([_row(1, 2, 1000), _row(2, 1, 3000)])
    assert more.startswith("2 DDP processes x 1 thread is 3.0x faster") and "Fewer workers" not in more
    threads = recommendation([_row(1, 1, 3000), _row(1, 2, 1000)])
    assert threads.startswith("1 process x 1 thread is 3.0x faster") and "Fewer threads win" in threads
    reached = recommendation([_row(1, 2, 1000, ttt=3.0), _row(2, 1, 3000, ttt=None)])
    assert "did not" in reached and "Fewer workers win" in reached


def test_default_layout_keeps_small_models_in_one_process():
    assert default_layout(2, 10**6)[:2] == (1, 2)
    assert default_layout(8, 49 * 10**6)[:2] == (1, 8)
    n, t, reason = default_layout(8, 60 * 10**6)
    assert (n, t) == (2, 4) and "trainflow scale" in reason
    assert default_layout(1, 60 * 10**6)[:2] == (1, 1)


# -- plan_launch ---------------------------------------------------------------------------------
AUTO = ["training.strategy=auto", "training.cpu_workers=auto"]


def _facts(cfg, gpus=0, device=16 * GB, sweep=None, cores=2):
    return HostFacts(gpus, device, cores, sweep, estimate_memory(cfg))


def test_plan_on_two_cpu_cores_without_sweep_takes_the_rule_and_asks_to_measure():
    cfg = load_config(DIGITS, AUTO)
    plan = plan_launch(cfg, _facts(cfg))
    t = plan.cfg.training
    assert (t.strategy, t.cpu_workers, t.threads_per_worker) == ("single", 1, 2)
    assert (plan.nproc_per_node, plan.nnodes, plan.backend, plan.world.size) == (1, 1, "gloo", 1)
    assert plan.unmeasured == cfg  # the probe measures after validation, from the config as given
    assert any("small models stay in one process" in r for r in plan.reasons)
    assert any(r.startswith("strategy auto -> single") for r in plan.reasons)
    assert plan.cfg.model.kind == cfg.model.kind and plan.cfg.training.lr == cfg.training.lr  # the rest is kept
    # Told the workers, or on several nodes, there is nothing to measure.
    assert not plan_launch(cfg, _facts(cfg), nproc=2).unmeasured
    assert not plan_launch(cfg, _facts(cfg), nproc=1, nnodes=2).unmeasured


def test_plan_takes_the_sweeps_best():
    cfg = load_config(DIGITS, AUTO)
    sweep = [_row(1, 2, 900), _row(1, 1, 800), _row(2, 1, 2500), _row(2, 1, 9000, batch=128)]
    plan = plan_launch(cfg, _facts(cfg, sweep=sweep))
    # Rows with the config's batch size (32) decide: 2 x 1 at 2,500 samples/s.
    assert (plan.cfg.training.cpu_workers, plan.cfg.training.threads_per_worker, plan.cfg.training.strategy) == \
        (2, 1, "ddp")
    assert plan.nproc_per_node == 2 and not plan.unmeasured
    assert "from the scale sweep" in plan.reasons[0]


def test_plan_leaves_concrete_configs_alone():
    cfg = load_config(DIGITS)
    plan = plan_launch(cfg, HostFacts())
    assert (plan.cfg, plan.reasons, plan.nproc_per_node) == (cfg, (), 2)
    assert plan_launch(cfg, HostFacts(), nproc=1).nproc_per_node == 1
    # Only the strategy is auto: the world is the configured cpu_workers (2).
    auto = load_config(DIGITS, ["training.strategy=auto"])
    plan = plan_launch(auto, _facts(auto))
    assert (plan.cfg.training.strategy, plan.cfg.training.cpu_workers, plan.world.size) == ("ddp", 2, 2)


def test_plan_on_gpus_uses_one_rank_per_gpu():
    cfg = load_config(DIGITS, AUTO)
    plan = plan_launch(cfg, _facts(cfg, gpus=4, device=80 * GB))
    assert (plan.cfg.training.strategy, plan.cfg.training.cpu_workers) == ("ddp", 1)
    assert (plan.nproc_per_node, plan.backend) == (4, "nccl")
    assert "4 ranks" in plan.reasons[-1]


def test_plan_sizes_an_elastic_job_for_its_largest_world_and_refuses_what_cannot_run():
    from core.errors import ConfigError

    cfg = load_config(DIGITS, ["training.max_restarts=1"])
    plan = plan_launch(cfg, HostFacts(), nproc=2, nnodes="1:3")
    assert (plan.nnodes, plan.node_range, plan.world.size) == ("1:3", (1, 3), 6)
    assert plan.layout == {"strategy": "ddp", "world_size": 6}  # what the launcher checks checkpoints against
    with pytest.raises(ConfigError, match="--nnodes > 1 needs --nproc"):
        plan_launch(cfg, HostFacts(), nnodes=2)
    with pytest.raises(ConfigError, match="--nproc: must be >= 1, got 0"):
        plan_launch(cfg, HostFacts(), nproc=0)


def test_saved_sweep_is_found_by_the_auto_config(tmp_path):
    import json

    swept = load_config(DIGITS, ["training.cpu_workers=2", "training.batch_size=128", "training.epochs=2"])
    path = advisor.sweep_path(tmp_path, swept)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rows": [_row(1, 2, 100)]}))
    assert advisor.load_sweep(tmp_path, load_config(DIGITS, AUTO)) == [_row(1, 2, 100)]
    assert advisor.load_sweep(tmp_path, load_config(DIGITS, [*AUTO, "training.lr=0.1"])) is None


# -- config ---------------------------------------------------------------------------------------
def test_config_accepts_auto_and_still_rejects_bad_values():
    t = config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "auto", "cpu_workers": "auto"}}).training
    assert (t.strategy, t.cpu_workers) == ("auto", "auto")
    assert config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "single", "cpu_workers": "auto"}})
    with pytest.raises(ConfigError, match=r"training\.cpu_workers: must be > 0, got 0"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"cpu_workers": 0}})
    with pytest.raises(ConfigError, match=r"training\.cpu_workers: must be a positive integer or 'auto', got 'many'"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"cpu_workers": "many"}})
    with pytest.raises(ConfigError, match=r"training\.strategy: must be one of .*'auto', got 'zero3'"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "zero3"}})
    with pytest.raises(ConfigError, match=r"training\.strategy: 'single' runs one process"):
        config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": {"strategy": "single", "cpu_workers": 2}})
