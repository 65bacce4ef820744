import math

import pytest

from training.trainer import lr_factor, scaled_lr


@pytest.mark.parametrize("rule,expected", [("linear", 0.04), ("sqrt", 0.01 * 2), ("none", 0.01)])
def test_lr_scales_with_global_batch(rule, expected):
    assert math.isclose(scaled_lr(0.01, 128, 32, rule), expected)


def test_warmup_is_linear_then_cosine_to_zero():
    g = 64  # samples per step: the schedule in samples is the classic one in steps
    f = [lr_factor(s * g, g, warmup=4 * g, total=14 * g) for s in range(15)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(f[4], 1.0)
    assert math.isclose(f[9], 0.5)
    assert math.isclose(f[14], 0.0, abs_tol=1e-12)
    assert all(f[s] >= f[s + 1] for s in range(4, 14))


def test_no_warmup_starts_at_full_lr():
    assert lr_factor(0, 32, 0, 320) == 1.0


def test_schedule_follows_samples_not_steps_across_a_resize():
    # 2 -> 1 workers with the global batch halved: the LR at a sample count is the same curve,
    # so the resized run's step at sample 640 gets what the unresized run's would.
    n, total, warm = 1000, 10_000, 1000
    before = lr_factor(640, 64, warm, total)
    after = lr_factor(640, 32, warm, total)
    assert math.isclose(before, (640 + 64) / warm) and math.isclose(after, (640 + 32) / warm)
    assert lr_factor(5 * n, 64, warm, total) == lr_factor(5 * n, 32, warm, total)  # past warm-up: equal
