"""The LM's attention takes SDPA's fused path: causal by flag, no mask tensor (what flash attention needs)."""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from tasks import lm_net as lm


def test_attention_is_causal_by_flag_without_a_mask(monkeypatch):
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.F, "scaled_dot_product_attention", spy)
    lm.CausalSelfAttention(32, 4, 0.0)(torch.randn(2, 8, 32))
    assert seen == [{"dropout_p": 0.0, "is_causal": True}]  # no attn_mask: flash stays eligible


def test_attention_runs_on_the_flash_kernel_alone():
    torch.manual_seed(0)
    attn = lm.CausalSelfAttention(32, 4, 0.0)
    x = torch.randn(2, 8, 32)
    with sdpa_kernel([SDPBackend.MATH]):
        expected = attn(x)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # raises if the call were not flash-eligible
        got = attn(x)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-5)  # (torch.testing's first call costs 0.5 s)
    # Causal: the first position's output ignores later tokens.
    x2 = x.clone()
    x2[:, 1:] += 1.0
    assert torch.allclose(attn(x2)[:, 0], got[:, 0], rtol=1e-6, atol=1e-6)


def test_an_empty_batch_runs_forward_and_backward():
    """An epoch's last step can leave a data-parallel rank 0 rows; it still runs the module (every
    rank joins DDP's gradient all-reduce). The heads' view once inferred -1 from 0 elements and
    failed: a DDP language model stopped at its first epoch's end."""
    model = lm.ByteLM(vocab_size=256, seq_len=8, d_model=32, n_layers=1, n_heads=4, d_ff=64)
    out = model(torch.zeros(0, 8, dtype=torch.long))
    assert out.shape == (0, 8, 256)
    out.sum().backward()
    grad = model.layers["0"].attn.q.weight.grad
    assert grad is not None and not grad.any()
