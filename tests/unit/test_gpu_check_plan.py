"""benchmarks/gpu_check.py's CPU side: the plan it would run is valid config, and its last line parses."""

import importlib.util
from pathlib import Path

import pytest

from core.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_100m_lm_runs_are_valid_configs_one_gpu_each(gpu_check, tmp_path):
    args = gpu_check.argparse.Namespace(lm=None, lm_set=[], only="lm100m", lm100m=True)
    plan = gpu_check.build_plan(args)
    assert [p[0] for p in plan] == ["lm100m-bf16", "lm100m-bf16-compile"]
    for name, config, sets, nproc in plan:
        cfg = load_config(ROOT / config, sets)  # a typo'd key or a bad layout fails here, not on the GPU
        assert nproc == 1 and cfg.training.strategy == "single" and cfg.training.precision == "bf16"
        assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.d_ff) == (1024, 8, 4096)
        assert cfg.training.compile.enabled is name.endswith("-compile")


def test_dry_run_prints_the_plan_and_a_name_value_last_line(gpu_check, tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--lm100m", "--only", "lm100m"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "dry_run=1 runs=2"
    assert "--set training.compile=true" in lines[1] and "--nproc-per-node=1" in lines[1]


def test_summary_line_gives_both_mfus_the_speedup_and_data_wait(gpu_check):
    rows = [{"name": "lm100m-bf16", "mfu": 0.2, "data_wait_frac": 0.01, "samples_per_s": 1000.0},
            {"name": "lm100m-bf16-compile", "rc": 1, "error": "boom"},
            {"name": "lm100m-bf16-compile-nondet", "mfu": 0.41, "data_wait_frac": 0.02, "samples_per_s": 2050.0}]
    line = gpu_check.summary_line(rows)
    assert dict(kv.split("=") for kv in line.split()) == {
        "mfu_eager": "0.2", "data_wait_frac_eager": "0.01", "mfu_compile": "0.41",
        "data_wait_frac_compile": "0.02", "compile_speedup": "2.05", "runs_failed": "1"}


def test_the_resnet50_step_rate_runs_on_cpu_too(gpu_check):
    rate = gpu_check.resnet50_step_rate("cpu", size=32, batch=2, steps=1, warmup=0)
    assert rate["images_per_s"] > 0 and rate["precision"] == "fp32" and rate["channels_last"] is False
