"""Strategies without a process group: the up-front checks, the single-process checkpoint, byte counts."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn

from core.errors import ConfigError
from training.checkpoint import load_state, save_state
from training.distributed import DistContext
from training.metrics import state_bytes
from training.parallel import build_strategy
from training.strategies import (
    DDPStrategy,
    SingleStrategy,
    _shard_targets,
    check_world,
)

CPU1 = DistContext(0, 0, 1, None, torch.device("cpu"))
CPU2 = DistContext(0, 0, 2, "gloo", torch.device("cpu"))  # never used for a collective here


def test_check_world_accepts_single_on_one_process_and_data_parallel_on_any_world():
    def accepted(name: str, world: int) -> bool:
        try:
            check_world(name, world)
        except ConfigError:
            return False
        return True

    assert [w for w in range(9) if accepted("single", w)] == [1]
    assert [w for w in range(9) if accepted("ddp", w)] == list(range(1, 9))
    assert [w for w in range(9) if accepted("fsdp", w)] == list(range(1, 9))


@pytest.mark.parametrize("name,world,needle", [
    ("single", 2, "world size is 2"),
    ("single", 8, "world size is 8"),
    ("zero3", 1, "got 'zero3'"),
    ("DDP", 2, "got 'DDP'"),
    ("ddp", 0, "world size must be >= 1"),
])
def test_check_world_rejects(name, world, needle):
    with pytest.raises(ConfigError) as err:
        check_world(name, world)
    assert str(err.value).startswith("training.strategy: ")
    assert needle in str(err.value)


def test_build_strategy_errors():
    with pytest.raises(ValueError, match=r"^training\.strategy: .*got 'zero3'"):
        build_strategy("zero3", CPU1)
    with pytest.raises(ValueError, match=r"^training\.strategy: .*world size is 2"):
        build_strategy("single", CPU2)
    with pytest.raises(ValueError, match=r"^training\.strategy: 'fsdp' needs a process group"):
        build_strategy("fsdp", CPU1)
    with pytest.raises(ValueError, match=r"^training\.precision: .*got 'fp16'"):
        build_strategy("single", CPU1, precision="fp16")


def test_build_strategy_kinds():
    assert isinstance(build_strategy("single", CPU1), SingleStrategy)
    ddp = build_strategy("ddp", CPU1)
    assert isinstance(ddp, DDPStrategy) and ddp.name == "ddp"
    model = nn.Linear(3, 2)
    # Without a process group ddp behaves as single: no wrapper, no-op sync context.
    assert ddp.wrap(model) is model and ddp.unwrapped(model) is model
    assert isinstance(ddp.sync_context(model, False), nullcontext)
    # bf16 on CPU: no autocast.
    assert isinstance(build_strategy("single", CPU1, "bf16").autocast(), nullcontext)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _train(model, opt, steps: int, start: int = 0) -> list[float]:
    losses = []
    for i in range(start, start + steps):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(12, 8, generator=g), torch.randint(0, 3, (12,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_single_checkpoint_round_trip(tmp_path):
    s = build_strategy("single", CPU1)
    model = s.wrap(_model(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    _train(model, opt, 3)
    extra = {"step": 3, "epoch": 1, "name": "x", "rng": torch.get_rng_state(), "hist": [1.5, {"a": 2}]}
    save_state(s, model, opt, extra, tmp_path)
    # DCP files, like every strategy's; no temp file left over
    assert sorted(p.name for p in tmp_path.iterdir()) == [".metadata", "__0_0.distcp", "extra.pt"]
    expected = _train(model, opt, 4, start=3)

    other = s.wrap(_model(1))  # different initial weights: the load must overwrite them
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-2, weight_decay=0.01)
    got_extra = load_state(s, other, opt2, tmp_path)
    assert got_extra["step"] == 3 and got_extra["name"] == "x" and got_extra["hist"] == [1.5, {"a": 2}]
    assert torch.equal(got_extra["rng"], extra["rng"])
    assert _train(other, opt2, 4, start=3) == expected  # bitwise
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    assert opt.state_dict()["state"][0]["step"] == opt2.state_dict()["state"][0]["step"]


def test_single_load_missing_or_corrupt(tmp_path):
    s = build_strategy("single", CPU1)
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FileNotFoundError):
        load_state(s, model, opt, tmp_path)
    torch.save({"model": {}, "optimizer": {}, "extra": {}}, tmp_path / "state.pt")  # an older trainflow's
    with pytest.raises(FileNotFoundError, match="state.pt is not read"):
        load_state(s, model, opt, tmp_path)
    save_state(s, model, opt, {"step": 1}, tmp_path)
    (tmp_path / "__0_0.distcp").write_bytes(b"not a checkpoint")
    with pytest.raises(Exception):
        load_state(s, model, opt, tmp_path)


def test_full_state_dict_is_a_copy():
    s = build_strategy("single", CPU1)
    model = _model(0)
    sd = s.full_state_dict(model)
    assert set(sd) == set(model.state_dict())
    sd["0.weight"].zero_()
    assert model[0].weight.abs().sum() > 0


def test_state_bytes_small_model():
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 5))  # 220 + 105 = 325 params
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert state_bytes(model, opt) == {"param_bytes": 325 * 4, "grad_bytes": 0, "optim_bytes": 0}
    nn.functional.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 5, (4,))).backward()
    opt.step()
    # AdamW: exp_avg + exp_avg_sq per param (2 x 325 floats) + one fp32 step scalar per tensor (4).
    assert state_bytes(model, opt) == {
        "param_bytes": 1300, "grad_bytes": 1300, "optim_bytes": 2 * 1300 + 4 * 4,
    }
    model.half()
    assert state_bytes(model, opt)["param_bytes"] == 325 * 2


def test_clip_grad_norm_returns_float():
    s = build_strategy("single", CPU1)
    model = nn.Linear(4, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    norm = s.clip_grad_norm(model, 1.0)
    assert isinstance(norm, float) and norm == pytest.approx(5.0)
    assert model.weight.grad.norm().item() == pytest.approx(1.0, rel=1e-5)


def test_fsdp_shard_targets():
    """FSDP units: every Linear/Conv (nested too), else each direct child that has parameters."""
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(),
                        nn.Sequential(nn.Linear(4, 4), nn.Dropout()), nn.Linear(4, 2))
    assert [type(m).__name__ for m in _shard_targets(cnn)] == ["Conv2d", "Linear", "Linear"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))

    blocks = nn.Sequential(Block(), nn.ReLU(), Block(), nn.LayerNorm(3))
    assert _shard_targets(blocks) == [blocks[0], blocks[2], blocks[3]]
