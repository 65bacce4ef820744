"""training.strategies under a real 2-process torchrun (CPU/gloo): DDP vs FSDP2.

One probe run (tests/integration/probes/strategy_probe.py, ~15 s on 2 cores) measures
everything; the tests assert on its JSON. Tolerances are set from measured values
(see each test) with one to two orders of magnitude of headroom.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "probes" / "strategy_probe.py"
STEPS = 30
HALF = STEPS // 2


@pytest.fixture(scope="module")
def probe(tmp_path_factory, repo_root) -> dict:
    work = tmp_path_factory.mktemp("strategy_probe")
    out = work / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(PROBE), "--out", str(out), "--workdir", str(work / "ckpt"), "--steps", str(STEPS)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=repo_root, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired as exc:  # a hung collective: kill, report what it printed
        pytest.fail(f"strategy probe timed out after 120 s\n{(exc.stderr or '')[-4000:]}")
    assert proc.returncode == 0 and out.is_file(), \
        f"probe failed (rc {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result = json.loads(out.read_text())
    result["wall_s"] = time.perf_counter() - t0
    return result


def _close(a: list[float], b: list[float], rtol: float, atol: float) -> float:
    """Max |a-b| after checking every element is within atol + rtol*|b|."""
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        assert abs(x - y) <= atol + rtol * abs(y), (x, y)
        worst = max(worst, abs(x - y))
    return worst


def test_ddp_and_fsdp_train_the_same(probe):
    # Measured: losses differ by <= 6e-8 (DDP all-reduce vs FSDP reduce-scatter rounding),
    # both within 4e-7 of one process on the whole batch; final weights within 3e-8 of
    # each other and 4e-6 of the one-process run (AdamW magnifies rounding in tiny grads).
    ddp, fsdp, plain = probe["ddp"], probe["fsdp"], probe["plain"]
    assert probe["world_size"] == 2
    assert len(ddp["losses"]) == len(fsdp["losses"]) == STEPS
    assert ddp["wrapped_type"] == "DistributedDataParallel"
    assert fsdp["wrapped_type"].startswith("FSDP") and fsdp["param_types"] == ["DTensor"]
    _close(fsdp["losses"], ddp["losses"], rtol=1e-5, atol=1e-6)
    _close(ddp["losses"], plain["losses"], rtol=1e-5, atol=1e-6)
    _close(fsdp["norms"], ddp["norms"], rtol=1e-5, atol=1e-6)  # clip_grad_norm over DTensor shards
    _close(ddp["norms"], plain["norms"], rtol=1e-5, atol=1e-6)
    assert max(plain["norms"]) > 1.0 > min(plain["norms"])  # clipping (max_norm 1) was active
    assert ddp["losses"][-1] < ddp["losses"][0] - 0.3  # it learns
    assert probe["ddp_vs_fsdp_final_max_diff"] < 1e-5
    assert ddp["final_vs_plain_max_diff"] < 1e-4 and fsdp["final_vs_plain_max_diff"] < 1e-4


def test_fsdp_holds_half_the_state_per_rank(probe):
    # Measured: 0.50001 (AdamW's per-tensor step scalars are not sharded).
    for name in ("ddp", "fsdp"):
        per_rank = probe[name]["bytes_per_rank"]
        assert len(per_rank) == 2
    ddp, fsdp = probe["ddp"]["bytes_after"], probe["fsdp"]["bytes_after"]
    n_params = 64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert ddp["param_bytes"] == n_params * 4 and ddp["grad_bytes"] == n_params * 4
    ratio = (fsdp["param_bytes"] + fsdp["optim_bytes"]) / (ddp["param_bytes"] + ddp["optim_bytes"])
    assert 0.4 <= ratio <= 0.65, ratio
    assert 0.4 <= fsdp["grad_bytes"] / ddp["grad_bytes"] <= 0.65
    assert probe["fsdp"]["bytes_before"]["optim_bytes"] == 0


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_checkpoint_resume_is_bitwise(probe, name):
    rec = probe[name]
    uninterrupted = rec["losses"]
    assert rec["fresh_save_optimizer_untouched"]
    assert rec["resume_first_half"] == uninterrupted[:HALF]  # after a save before the first step
    assert rec["resume_continued"] == uninterrupted[HALF:]  # saving does not perturb training
    assert rec["resume_loaded"] == uninterrupted[HALF:]  # fresh model + optimizer, loaded: bitwise
    assert rec["loaded_extra_ok"]
    # One format: rank 0 writes a replicated state alone, every rank its fsdp shards.
    expected = [".metadata", "__0_0.distcp", *(["__1_0.distcp"] if name == "fsdp" else []), "extra.pt"]
    assert rec["ckpt_files"] == expected


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_bad_checkpoint_raises_on_every_rank(probe, name):
    rec = probe[name]
    assert all(rec["missing_raises_all"]) and len(rec["missing_raises_all"]) == 2
    assert rec["corrupt_raises_all"] == ["RuntimeError", "RuntimeError"]  # not DCP's BaseException


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_full_state_dict_loads_into_plain_model(probe, name):
    rec = probe[name]
    assert rec["full_state_is_none_by_rank"] == [False, True]
    assert rec["full_state_plain_tensors"]
    assert rec["full_state_keys"] == sorted(
        f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias"))
    assert rec["full_state_output_max_diff"] == 0.0  # measured: identical outputs


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_grad_accumulation_matches_double_batch(probe, name):
    # Measured: 7.5e-9 max weight difference after one SGD step of size ~0.03.
    rec = probe[name]
    assert rec["accum_step_size"] > 1e-3
    assert rec["accum_max_param_diff"] < 1e-6
    assert rec["accum_restore_max_param_diff"] < 1e-6  # sync restored on leaving sync_context(False)
    norms = rec["nosync_grad_norms_by_rank"]
    if name == "ddp":  # the no-sync micro-step left local, un-averaged grads: ranks differ
        assert norms[0] != norms[1]
    else:  # FSDP2 keeps them unsharded until the synced micro-step: no sharded grads yet
        assert rec["nosync_grad_none"]
