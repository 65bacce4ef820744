"""``training.compile``: the compiled model trains like the eager one and leaves plain artifacts.

The byte LM (tests/integration/probes/lm_probe.py) trains eagerly in one process, compiled in
one process, and compiled under DDP and under FSDP2 with 2 torchrun processes at the same
global batch. The one-process compiled run uses the ``aot_eager`` backend: dynamo and
AOTAutograd trace and split the graph as with inductor, without inductor's C++ build, which
costs ~30 s per process on this CPU (inductor was checked by hand; docs/training.md, "Compiling"). The
DDP and FSDP2 runs use the ``eager`` backend: what they show is the wrapping (compiled
outermost; dynamo's DDP optimizer, which splits the graph at the gradient buckets, wraps
whichever backend), the parity with eager training and the plain state-dict keys; AOTAutograd's
tracing would add ~4 s of CPU to each of their processes.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine_helpers import lm_ok, lm_runs, train_lm

pytestmark = pytest.mark.integration

COMPILED = ["training.compile.enabled=true", "training.compile.backend=aot_eager"]
# Under DDP / FSDP2: dynamo's capture (and DDP's graph split) without AOTAutograd (see above).
COMPILED_EAGER = ["training.compile.enabled=true", "training.compile.backend=eager"]
EPOCHS = ["training.epochs=2"]
# Measured: compiled per-epoch losses equal to eager's in one process, within 3e-7 under DDP and
# FSDP2 (the all-reduce changes the summation order); tolerances ~30x.
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-5
WEIGHT_ATOL = 1e-3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (result, out folder)}, each run started on first use."""
    layouts = {
        "eager": (EPOCHS, 1),
        "compiled": ([*EPOCHS, *COMPILED], 1),
        # 4 per rank x 2 ranks: the same global batch (8) as one process.
        "compiled_ddp": ([*EPOCHS, *COMPILED_EAGER, "training.strategy=ddp", "training.cpu_workers=2",
                          "training.batch_size=4"], 2),
        "compiled_fsdp": ([*EPOCHS, *COMPILED_EAGER, "training.strategy=fsdp", "training.cpu_workers=2",
                           "training.batch_size=4"], 2),
    }
    return lm_runs(tmp_path_factory, layouts)


def _curve(result):
    return [(h["train_loss"], h["val_loss"]) for h in result["history"]]


def _checkpoint_keys(out):
    latest = sorted((out / "checkpoints").glob("step_*"))[-1]
    from torch.distributed.checkpoint import FileSystemReader  # DCP files, keys in .metadata

    keys = FileSystemReader(latest).read_metadata().state_dict_metadata
    return [k.removeprefix("model.") for k in keys if k.startswith("model.")]


@pytest.mark.parametrize("name", ["compiled", "compiled_ddp", "compiled_fsdp"])
def test_compiled_training_matches_eager_and_keeps_plain_keys(runs, name):
    eager, eager_out = runs("eager")
    result, out = runs(name)
    assert result["global_batch"] == eager["global_batch"] == 8
    torch.testing.assert_close(_curve(result), _curve(eager), rtol=LOSS_RTOL, atol=LOSS_ATOL)
    # Checkpoints and the registered weights hold the plain module's keys (no `_orig_mod.`,
    # no `module.`), the ones an eager run writes: resumable and loadable across compile on/off.
    assert sorted(_checkpoint_keys(out)) == sorted(_checkpoint_keys(eager_out))
    weights = torch.load(out / "weights.pt", map_location="cpu", weights_only=True)
    plain = torch.load(eager_out / "weights.pt", map_location="cpu", weights_only=True)
    assert list(weights) == list(plain) and not any("_orig_mod" in k for k in weights)
    for k in plain:
        torch.testing.assert_close(weights[k], plain[k], rtol=0, atol=WEIGHT_ATOL)


def test_compiled_model_exports_a_program_that_scores_like_the_weights(runs):
    from training.export import load_exported

    result, out = runs("compiled")
    assert result["model_pt2"] == "model.pt2"
    program = load_exported(out / "model.pt2")
    eager_program = load_exported(runs("eager")[1] / "model.pt2")
    x = torch.arange(20).remainder(256).reshape(2, 10)  # a dynamic batch and sequence length
    with torch.no_grad():
        torch.testing.assert_close(program(x), eager_program(x), rtol=1e-4, atol=1e-4)


def test_a_compiled_checkpoint_resumes_with_compile_off(runs, tmp_path):
    import shutil

    result, out = runs("compiled")
    resumed_out = tmp_path / "out"
    shutil.copytree(out, resumed_out)
    # Same resume id (compile is a layout key): no --force-resume needed. (More epochs would be
    # another resume id; the finished run's last checkpoint is what a restart would load.)
    again = lm_ok(train_lm(resumed_out, EPOCHS))
    assert again["resumed_from_step"] == result["steps"] == 16
    assert again["status"] == "completed"
    assert again["weights_sha256"] == result["weights_sha256"]


def test_uncompiled_strips_only_the_compile_wrapper():
    from torch import nn

    from training.strategies import uncompiled

    plain = nn.Sequential(nn.Linear(2, 2))
    assert uncompiled(plain) is plain
    # Wrapping compiles nothing until called (the ~3 s here is importing dynamo: not a unit test).
    compiled = torch.compile(plain, backend="eager")
    assert uncompiled(compiled) is plain
    assert list(compiled.state_dict())[0].startswith("_orig_mod.")  # what checkpoints must not hold
    assert list(uncompiled(compiled).state_dict()) == ["0.weight", "0.bias"]


def test_a_zero_row_step_runs_the_module_uncompiled():
    # Inductor's CPU convolution backward fails on 0 rows (a stride assertion; the digits CNN
    # under DDP hit it on the epoch's short last step): such a step bypasses the compiled graph.
    from tasks import get_task
    from training.distributed import DistContext
    from training.parallel import build_strategy

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    strat = build_strategy("single", DistContext(0, 0, 1, None, torch.device("cpu")))
    strat.task = get_task("classification")
    torch.manual_seed(0)
    model = strat.compile(torch.nn.Sequential(torch.nn.Linear(3, 4)), backend=counting_backend)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    assert strat.forward_backward(model, x, y, scale=0.25) > 0 and len(graphs) == 1
    assert strat.forward_backward(model, x[:0], y[:0], scale=0.25) == 0.0
    assert strat.eval_sums(model, x[:0], y[:0]) == (0.0, 0, 0)
    assert len(graphs) == 1  # no graph traced for the 0-row shape
