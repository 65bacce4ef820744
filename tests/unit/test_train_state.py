"""TrainState: one definition of a checkpoint's contents, saved when the checkpointer decides."""

from __future__ import annotations

import time

import pytest
import torch

from core.config import load_config
from training.checkpoint import CheckpointManager, CheckpointMismatchError
from training.distributed import DistContext
from training.checkpoint import FORMAT, StateFormatError, TrainState, load_state
from training.parallel import build_strategy

CTX = DistContext(0, 0, 1, None, torch.device("cpu"))


def _state(tmp_path, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    st = TrainState(model=model, optimizer=opt, step=7, epoch=1, cursor=448, epoch_sums=[[1.5, 448]],
                    best=0.3, bad_epochs=1, history=[{"epoch": 1, "train_loss": 0.5}], rng=[torch.get_rng_state()],
                    config_id="c", resume_id="r", data_md5="d", layout={"strategy": "single", "world_size": 1},
                    plan={"dp_size": 1, "micro_batch": 32, "grad_accum": 2, "global_batch": 64, "lr": 0.1,
                          "configured": [32, 2]}, **kw)
    return CheckpointManager(tmp_path, CTX, build_strategy("single", CTX), keep=2, every_steps=5), st


def test_train_state_round_trips_through_a_checkpoint(tmp_path):
    ck, st = _state(tmp_path)
    assert ck.maybe_save(st.step, st, force=True) is not None
    ck.wait()
    torch.manual_seed(1)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    back = ck.load_state(model, opt)
    assert back.model is model and back.optimizer is opt
    assert back.meta().keys() == st.meta().keys() and back.meta()["format"] == FORMAT
    for key in ("step", "epoch", "cursor", "epoch_sums", "best", "bad_epochs", "history", "config_id",
                "resume_id", "data_md5", "layout", "plan"):
        assert getattr(back, key) == getattr(st, key), key
    assert torch.equal(back.rng[0], st.rng[0])
    assert torch.equal(model.weight, st.model.weight) and opt.state_dict()["state"][0]["step"] == 1
    assert back.writer() == {"world_size": 1, "strategy": "single", "dp_size": 1, "micro_batch": 32,
                             "grad_accum": 2, "global_batch": 64}
    marker = (tmp_path / "step_00000007" / "COMPLETE").read_text()
    assert '"resume_id": "r"' in marker


def test_the_checkpointer_alone_decides_when_to_save(tmp_path):
    ck, st = _state(tmp_path)
    ck.every_epochs = 2
    made = []
    state = lambda: made.append(1) or st  # noqa: E731 - built only when a save happens
    assert [s for s in range(1, 12) if ck.maybe_save(s, state) is not None] == [5, 10]
    assert ck.maybe_save(11, state, epoch_done=1) is None and ck.maybe_save(11, state, epoch_done=2) is not None
    assert ck.maybe_save(12, state, force=True) is not None  # preemption, last epoch, early stop
    assert len(made) == ck.saves == 4
    # training.checkpoint_budget: a due epoch end is skipped while saves cost over 1 % of the time so far
    ck.budget, ck._t0 = 0.01, time.perf_counter()
    assert ck.maybe_save(13, state, epoch_done=4) is None and ck.maybe_save(13, state, force=True) is not None
    ck._t0 -= 100 * (ck.stall_s + ck.write_cpu_s) + 1
    assert ck.maybe_save(14, state, epoch_done=4) is not None and len(made) == ck.saves == 6
    ck.enabled = False
    assert ck.maybe_save(20, state, force=True) is None and ck.load_state(st.model, st.optimizer) is None


def test_a_checkpoint_without_the_cursor_is_refused_with_its_reason(tmp_path):
    ck, st = _state(tmp_path)
    ck.save(3, st.model, st.optimizer, {"step": 3, "epoch": 0, "pos": 2})  # an older trainflow's extra
    ck.wait()
    with pytest.raises(CheckpointMismatchError, match="older version"):
        ck.load_state(st.model, st.optimizer)
    with pytest.raises(StateFormatError, match="lacks cursor"):
        TrainState.from_meta({"format": FORMAT, **{k: 0 for k in TrainState._META if k != "cursor"}})


def test_resume_id_ignores_layout_keys_but_not_what_is_learned(repo_root):
    cfg = repo_root / "configs" / "digits.yaml"
    base = load_config(cfg)
    fsdp = load_config(cfg, ["training.strategy=fsdp", "training.cpu_workers=1", "training.checkpoint_every_steps=5"])
    assert fsdp.config_id() != base.config_id() and fsdp.resume_id() == base.resume_id()
    assert load_config(cfg, ["training.lr=0.001"]).resume_id() != base.resume_id()
    assert load_config(cfg, ["training.batch_size=16"]).resume_id() != base.resume_id()


def _fqn_optim_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, opt)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_dcp_checkpoint_loads_into_a_replicated_model(tmp_path):
    """What fsdp writes (DCP, FQN-keyed model and optimizer state + extra.pt) loads into single/ddp."""
    import torch.distributed.checkpoint as dcp

    from training.checkpoint import EXTRA_FILE

    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(src.parameters(), lr=0.1)
    src(torch.ones(3, 4)).sum().backward()
    opt.step()
    model_sd, optim_sd = _fqn_optim_state(src, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp_path, no_dist=True)
    torch.save({"step": 1, "layout": {"strategy": "fsdp", "world_size": 2}}, tmp_path / EXTRA_FILE)

    torch.manual_seed(1)
    dst = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt2 = torch.optim.AdamW(dst.parameters(), lr=0.1)
    extra = load_state(build_strategy("single", CTX), dst, opt2, tmp_path)
    assert extra["step"] == 1
    for a, b in zip(src.state_dict().values(), dst.state_dict().values()):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i]["exp_avg"], s2[i]["exp_avg"]) for i in s1)


def test_a_model_parallel_checkpoint_is_refused_by_a_replicated_model_and_names_the_way_out(tmp_path):
    ck, st = _state(tmp_path)
    meta = st.meta()
    meta["layout"] = {"strategy": "tp", "world_size": 2, "dp": 1, "tp": 2, "pp": 1}
    ck.save(1, st.model, st.optimizer, meta)
    ck.wait()
    with pytest.raises(CheckpointMismatchError, match=r"resume with 2 worker\(s\) \(--nproc\) with "
                                                      r"training.strategy=tp, training.parallel.tp=2"):
        ck.load_state(st.model, st.optimizer)


def test_launcher_matches_a_checkpoint_on_its_resume_id(tmp_path):
    import json

    from core.errors import ConfigError
    from training.launcher import _check_resumable
    from training.layouts import layout_for

    step = tmp_path / "checkpoints" / "step_00000004"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text(json.dumps({"step": 4, "config_id": "ddp-id", "resume_id": "r", "data_md5": "d",
                                               "layout": layout_for("ddp", 2)}))
    # Another strategy and world size: another config id, the same resume id.
    _check_resumable(tmp_path, "fsdp-id", "d", False, layout_for("fsdp", 1), resume_id="r")
    with pytest.raises(ConfigError, match="written for resume_id=r, this run has r2"):
        _check_resumable(tmp_path, "fsdp-id", "d", False, layout_for("fsdp", 1), resume_id="r2")
