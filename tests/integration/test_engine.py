"""The distributed engine on CPU/gloo: strategies, agreed stopping, uneven shards, multi-node, metrics."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from core.config import load_config
from tests.conftest import VENV_BIN
from tests.engine_helpers import train
from training.data import load_splits

pytestmark = pytest.mark.integration

TWO = ["training.epochs=2"]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, bundled_data):
    return train(tmp_path_factory.mktemp("ddp") / "out", [*TWO, "training.strategy=ddp"])


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, bundled_data):
    # Early stopping that never sees an improvement after epoch 1 and never stops (2 epochs): the
    # sharded run ends with epoch 1's weights; the loss curves are those of the ddp run still.
    return train(tmp_path_factory.mktemp("fsdp") / "out", [*TWO, "training.strategy=fsdp",
                                                           "training.early_stopping.patience=5",
                                                           "training.early_stopping.min_delta=100"])


def test_fsdp_and_ddp_loss_curves_agree(ddp_run, fsdp_run):
    assert fsdp_run["strategy"] == "fsdp" and ddp_run["strategy"] == "ddp"
    d = [h["train_loss"] for h in ddp_run["history"]]
    f = [h["train_loss"] for h in fsdp_run["history"]]
    np.testing.assert_allclose(f, d, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fsdp_run["final"]["val_accuracy"], ddp_run["final"]["val_accuracy"], atol=0.01)


def test_fsdp_keeps_the_best_epochs_shards_and_exports_them(ddp_run, fsdp_run):
    kept = fsdp_run["kept_epoch"]
    assert (kept["epoch"], kept["of"], kept["restored"]) == (1, 2, True)
    assert ddp_run["kept_epoch"] is None  # no early stopping: the last epoch, as before


def test_fsdp_shards_parameters_and_optimizer_state(ddp_run, fsdp_run):
    def per_rank(run):
        return [r["param_bytes"] + r["optim_bytes"] for r in run["ranks"]]

    ddp, fsdp = per_rank(ddp_run), per_rank(fsdp_run)
    assert len(ddp) == len(fsdp) == 2
    for f, d in zip(fsdp, ddp):
        assert 0.4 <= f / d <= 0.65, (f, d)  # about 1/world, with slack for uneven shards


def test_ddp_run_reports_step_metrics(ddp_run):
    perf = ddp_run["perf"]
    for key in ("perf/samples_per_s", "perf/step_time_median_ms", "perf/step_time_max_ms",
                "perf/data_wait_frac", "perf/allreduce_s"):
        assert key in perf, key
    assert 0 <= perf["perf/data_wait_frac"] <= 1
    assert perf["perf/allreduce_s"] > 0
    # Every rank's own numbers, and one node's system numbers, from the same gather.
    for r in (0, 1):
        for name in ("step_time_ms", "data_wait_ms", "allreduce_wait_ms", "forward_sync_ms", "compute_ms"):
            assert perf[f"rank/{r}/{name}"] >= 0, (r, name)
        assert perf[f"rank/{r}/peak_mem_mb"] > 0
    assert perf["node/0/mem_used_mb"] > 0 and not any(k.startswith("node/1/") for k in perf)
    assert 0 <= ddp_run["checkpoint_stall_frac"] < 1
    assert all(r["peak_mem_mb"] > 0 for r in ddp_run["ranks"])


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory, bundled_data):
    """3 ranks, which cannot split the training set evenly, with a patience that runs out: the
    early-stop and uneven-shard tests both ask whether the ranks end together."""
    # min_delta larger than any possible improvement: patience runs out after epoch 2, and epoch 1
    # stays the best. Balanced accuracy is scored from every rank's gathered validation outputs.
    return train(tmp_path_factory.mktemp("three") / "out",
                 ["training.epochs=6", "training.early_stopping.patience=1", "training.early_stopping.min_delta=100",
                  "training.early_stopping.metric=val_balanced_accuracy"],
                 nproc=3)


def test_early_stop_is_agreed_by_all_ranks(three_ranks):
    r = three_ranks
    assert r["status"] == "completed" and r["stopped_early_at_epoch"] == 2
    assert [x["epochs_run"] for x in r["ranks"]] == [2, 2, 2]
    assert len({x["step"] for x in r["ranks"]}) == 1
    assert len(r["history"]) == 2


def test_the_best_epochs_weights_are_the_ones_exported(three_ranks):
    import torch
    import torch.distributed.checkpoint as dcp
    from pathlib import Path

    from training.trainer import state_dict_sha256

    r = three_ranks
    kept = r["kept_epoch"]
    assert (kept["epoch"], kept["of"], kept["best_epoch"], kept["restored"]) == (1, 2, 1, True)
    assert kept["metric"] == "val_balanced_accuracy" and 0 < kept["best_value"] <= 1
    # the score of every val row (gathered from 3 uneven slices), logged per epoch
    assert [h["val_scores"]["balanced_accuracy"] for h in r["history"]][0] == kept["best_value"]
    # The exported weights are those the epoch-1 checkpoint holds, not the last epoch's.
    first, last = sorted((Path(r["out_dir"]) / "checkpoints").glob("step_*"))

    def weights(folder):  # the checkpoint's model, read as DCP wrote it
        meta = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
        state = {"model": {k[len("model."):]: torch.empty(m.size, dtype=m.properties.dtype)
                           for k, m in meta.items() if k.startswith("model.")}}
        dcp.load(state, checkpoint_id=folder, no_dist=True)
        return state_dict_sha256(state["model"])

    assert weights(first) == r["weights_sha256"] != weights(last)


def test_uneven_shards_do_not_hang(three_ranks, repo_root):
    n_train = len(load_splits(load_config(repo_root / "configs" / "digits.yaml"), repo_root, 0).train)
    assert n_train % 3 != 0  # 3 ranks cannot split it evenly
    r = three_ranks
    assert r["world_size"] == 3 and r["status"] == "completed"
    assert len({x["step"] for x in r["ranks"]}) == 1


# Two agents forming one world over c10d rendezvous: tests/integration/test_multinode.py (--nnodes 2,
# one worker each, asserting the world of 2 completes) and tests/fault/test_elastic.py (one shared --out).
def test_multi_node_without_endpoint_is_a_clear_error(repo_root):
    p = subprocess.run([str(VENV_BIN / "trainflow"), "train", "--config", "configs/digits.yaml", "--out", "/tmp/x",
                        "--nnodes", "2", "--nproc", "1"], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "--rdzv-endpoint" in p.stderr


def test_dataloader_path_and_switches_leave_the_weights_unchanged(ddp_run, tmp_path):
    # Same batches through a DataLoader with a worker and prefetch, with no comm hook and no
    # checkpoints: none of that may change a single bit of the result.
    r = train(tmp_path / "out", [*TWO, "training.loader.kind=dataloader", "training.loader.num_workers=1",
                                 "training.loader.prefetch_factor=2", "training.metrics=false",
                                 "training.checkpoints=false"])
    assert r["weights_sha256"] == ddp_run["weights_sha256"]
    assert r["perf"] == {} and r["checkpoint_stall_s"] == 0
    assert not (tmp_path / "out" / "checkpoints").exists()
