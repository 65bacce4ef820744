"""Two torchrun agents on 127.0.0.1 (one CPU worker each) whose --out folders differ, as on hosts
without shared storage: every agent reports the job's real outcome, and a job that would need a
shared folder to resume is refused at start on every agent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import VENV_BIN
from tests.engine_helpers import free_port

pytestmark = pytest.mark.integration


def _two_agents(repo_root: Path, outs: list[Path], *overrides: str) -> list[subprocess.CompletedProcess]:
    """``trainflow train`` twice at once, one agent each, meeting over c10d; node-rank 0 writes into outs[0]."""
    port = free_port()
    sets = [item for o in ("training.epochs=1", *overrides) for item in ("--set", o)]
    agents = [subprocess.Popen([str(VENV_BIN / "trainflow"), "train", "--config", "tests/configs/digits-engine.yaml",
                                "--out", str(out), *sets, "--nnodes", "2", "--nproc", "1", "--node-rank", str(rank),
                                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"sep-{port}"],
                               cwd=repo_root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for rank, out in enumerate(outs)]
    outs_err = [a.communicate(timeout=240) for a in agents]
    return [subprocess.CompletedProcess(a.args, a.returncode, o, e) for a, (o, e) in zip(agents, outs_err)]


def test_agents_with_their_own_out_both_report_the_job_outcome(bundled_data, repo_root, tmp_path):
    outs = [tmp_path / "host-a", tmp_path / "host-b"]
    # No restarts: nothing needs rank 0's checkpoints on the other host, so separate folders are fine.
    done = _two_agents(repo_root, outs, "training.max_restarts=0")
    assert [p.returncode for p in done] == [0, 0], [p.stderr[-2000:] for p in done]
    results = [json.loads((out / "result.json").read_text()) for out in outs]
    assert all(r["status"] == "completed" and r["world_size"] == 2 for r in results)
    assert results[0]["weights_sha256"] == results[1]["weights_sha256"]
    # c10d ranks nodes by arrival: either folder may be rank 0's, and only that one holds the weights.
    main = next(r for r in results if "node_copy" not in r)
    copy = next(r for r in results if "node_copy" in r)
    assert "weights" not in copy
    holder = Path(main["rank0"]["out_dir"])
    assert copy["rank0"] == main["rank0"] and main["shared_out"] is False
    assert (holder / "weights.pt").is_file() and (holder / "model.pt2").is_file()
    assert not [out for out in outs if out != holder and (out / "weights.pt").exists()]
    # What each agent printed is its node's view of the same job.
    printed = [json.loads(p.stdout) for p in done]
    assert {p["weights_sha256"] for p in printed} == {main["weights_sha256"]}


def test_separate_out_folders_are_refused_at_start_where_resuming_needs_them(bundled_data, repo_root, tmp_path):
    outs = [tmp_path / "host-a", tmp_path / "host-b"]
    # training.max_restarts 3 (the default): a restart resumes from rank 0's checkpoints on every node.
    done = _two_agents(repo_root, outs)
    for p in done:
        assert p.returncode == 1, p.stderr[-2000:]
        assert "--out is not storage every node shares" in p.stderr and "training.max_restarts=3" in p.stderr
        assert "(an input error: not retried)" in p.stderr
    for out in outs:  # refused before the first step: nothing trained, nothing to resume
        assert not (out / "result.json").exists() and not (out / "checkpoints").exists()
