"""The ``causal_lm`` task's module around a Hugging Face causal LM: ``x`` int64 ``[n, 2, L]`` (token
ids, attention mask; right-padded) -> next-token logits ``[n, T, vocab]``, where T is the batch's
longest sequence (dynamic padding: a batch of short pairs runs short). An empty batch (an epoch's
last step on some data-parallel rank) runs one padding token and returns none of it, so every rank
joins the collectives and every parameter gets a (zero) gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tasks.causal_lm_data import IGNORE


class CausalLMModule(nn.Module):
    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not len(x):  # the model cannot reshape a 0-row attention mask
            return self.hf(input_ids=x.new_zeros(1, 1), use_cache=False).logits[:0]
        ids, mask = x[:, 0], x[:, 1]
        # One host sync per batch for the length: what dynamic padding costs.
        t = max(int(mask.sum(1).max()), 1)
        return self.hf(input_ids=ids[:, :t], attention_mask=mask[:, :t], use_cache=False).logits


def token_loss(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the learned targets (``IGNORE`` elsewhere) in fp32; ``y`` cut to the logits' length."""
    y = y[:, :logits.shape[1]]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), ignore_index=IGNORE,
                           reduction=reduction)
