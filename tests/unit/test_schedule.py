import math

import pytest

from training.trainer import lr_lambda, scaled_lr


@pytest.mark.parametrize("rule,expected", [("linear", 0.04), ("sqrt", 0.01 * 2), ("none", 0.01)])
def test_lr_scales_with_global_batch(rule, expected):
    assert math.isclose(scaled_lr(0.01, 128, 32, rule), expected)


def test_warmup_is_linear_then_cosine_to_zero():
    f = lr_lambda(warmup_steps=4, total_steps=14)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert math.isclose(f(4), 1.0)
    assert math.isclose(f(9), 0.5)
    assert math.isclose(f(14), 0.0, abs_tol=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(4, 14))


def test_no_warmup_starts_at_full_lr():
    assert lr_lambda(0, 10)(0) == 1.0
