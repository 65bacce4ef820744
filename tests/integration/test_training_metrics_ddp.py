"""training.metrics under real DDP: 2 CPU ranks on gloo, launched by torchrun in a subprocess.

The probe (probes/metrics_probe.py) trains the same tiny model with and without the
all-reduce timing and writes what it saw as JSON; the assertions live here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PROBE = Path(__file__).parent / "probes" / "metrics_probe.py"
TIMEOUT_S = 180  # torchrun start-up is ~7 s here and the probe ~3 s; a busy box gets slack


@pytest.fixture(scope="module")
def report(tmp_path_factory, repo_root) -> dict:
    out = tmp_path_factory.mktemp("metrics_probe") / "report.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(PROBE), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Own session: on a timeout the whole tree (torchrun and both workers) is killed.
    proc = subprocess.Popen(cmd, cwd=repo_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        pytest.fail(f"metrics probe exceeded {TIMEOUT_S}s:\n{log[-4000:]}")
    assert proc.returncode == 0, f"metrics probe failed (rc {proc.returncode}):\n{log[-4000:]}"
    return json.loads(out.read_text())


def test_timing_leaves_weights_bitwise_equal(report):
    r0, r1 = report["ranks"]
    assert r0["digest_plain"] == r0["digest_hook"] == r1["digest_plain"] == r1["digest_hook"]
    assert r0["digest_plain"] != r0["digest_init"]  # it did train


def test_snapshot_on_rank_0_only_with_sane_values(report):
    assert [r["snapshot_is_none"] for r in report["ranks"]] == [False, True]
    s = report["snapshot_hook"]
    assert s["steps"] == 20 and s["window_s"] > 0 and s["samples_per_s"] > 0
    assert 0 < s["step_time_min_ms"] <= s["step_time_median_ms"] <= s["step_time_max_ms"]
    assert s["allreduce_s"] > 0 and 0 < s["allreduce_frac"] <= 1
    assert 0 <= s["data_wait_frac"] <= 1
    assert s["ckpt_stall_s"] == pytest.approx(0.01) and 0 < s["ckpt_stall_frac"] < 1
    assert len(s["peak_mem_mb"]) == 2 and all(m > 0 for m in s["peak_mem_mb"])
    assert isinstance(s["straggler"], bool)
    # Without attach nothing measures the all-reduce.
    assert report["snapshot_plain"]["allreduce_s"] == 0.0


def test_a_slow_rank_shows_as_its_peers_allreduce_wait(report):
    # Rank 1 sleeps 30 ms a step. DDP's all-reduce syncs every step, so both ranks'
    # step times come out equal; the slow rank shows as rank 0 waiting in the all-reduce.
    fast, slow = report["raw_slow"]
    assert fast["allreduce_s"] > slow["allreduce_s"]
    assert fast["step_time_median_s"] == pytest.approx(slow["step_time_median_s"], rel=0.25)


def test_dtensor_bytes_count_the_local_shard(report):
    for r in report["ranks"]:
        d = r["dtensor"]
        assert d["dt_bytes"] * 2 == d["full_bytes"]
        st = d["state"]
        assert st["param_bytes"] * 2 == d["full_param_bytes"]
        assert st["grad_bytes"] == st["param_bytes"]
        assert st["optim_bytes"] == 2 * st["param_bytes"] + 4 * d["n_params"]
