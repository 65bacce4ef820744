"""A small byte-level decoder-only transformer (``model.kind: lm``): int64 ``[batch, seq]`` byte
tokens -> logits ``[batch, seq, vocab]`` for the next byte at every position. Pre-LN blocks, causal
``scaled_dot_product_attention``, a GELU MLP, a final LayerNorm and an untied head.

The layout serves model parallelism (``tp_plan``, ``stage_layers``, ``split_stage`` through the
task's ``ParallelPlan``): separate ``q``/``k``/``v``/``o`` and ``up``/``down`` Linears (column /
row sharded), and blocks in a ``ModuleDict`` keyed by index, so a pipeline stage deletes what it
does not own and keeps the full model's state-dict keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        # The heads from the width (under tensor parallelism, this rank's n_heads / tp). Not -1: a 0-row
        # batch (an epoch's last step on some data-parallel rank) has no size to infer it from.
        heads = q.shape[-1] // self.head_dim
        q, k, v = (z.view(b, t, heads, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model, d_ff)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class ByteLM(nn.Module):
    """Decoder-only LM. A pipeline stage is this module with parts set to None / deleted."""

    def __init__(self, vocab_size: int = 256, seq_len: int = 64, d_model: int = 64, n_layers: int = 2,
                 n_heads: int = 4, d_ff: int = 256, dropout: float = 0.0):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb: nn.Embedding | None = nn.Embedding(vocab_size, d_model)
        self.pos_emb: nn.Embedding | None = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleDict({str(i): Block(d_model, n_heads, d_ff, dropout) for i in range(n_layers)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(d_model)
        self.head: nn.Linear | None = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:  # first stage (or the whole model): tokens in
            pos = torch.arange(x.shape[1], device=x.device)
            h = self.drop(self.tok_emb(x) + self.pos_emb(pos))
        else:  # a later pipeline stage: the previous stage's activations in
            h = x
        for block in self.layers.values():
            h = block(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.head is not None:
            h = self.head(h)
        return h


def token_loss(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every target: ``[n, T, C]`` logits (each token is one prediction), or
    ``[n, C]`` for a classifier; computed in fp32."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.reshape(-1), reduction=reduction)


def _init_weights(m: nn.Module) -> None:
    # GPT-2 style: N(0, 0.02) weights, zero biases; LayerNorm keeps ones/zeros.
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, mean=0.0, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


def stage_layers(n_layers: int, n_stages: int) -> list[list[int]]:
    """Block indices per pipeline stage: contiguous, sizes differ by at most one (earlier stages larger)."""
    if not 1 <= n_stages <= n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} pipeline stages")
    base, extra = divmod(n_layers, n_stages)
    return [list(range(s * base + min(s, extra), (s + 1) * base + min(s + 1, extra))) for s in range(n_stages)]


def split_stage(model: ByteLM, stage: int, n_stages: int) -> ByteLM:
    """Keep only what pipeline stage ``stage`` of ``n_stages`` runs (in place; parameter names
    unchanged): its blocks, and the embeddings on the first stage, the norm and head on the last."""
    keep = set(stage_layers(len(model.layers), n_stages)[stage])
    for name in list(model.layers.keys()):
        if int(name) not in keep:
            del model.layers[name]
    if stage != 0:
        model.tok_emb = model.pos_emb = None
    if stage != n_stages - 1:
        model.norm = model.head = None
    return model


def tp_plan() -> dict:
    """``parallelize_module`` plan for one ``Block``, Megatron-style: q/k/v and up split by output
    features, o and down by input features (two all-reduces each way per block); LayerNorms and
    embeddings replicated. No SequenceParallel: it needs reduce-scatter."""
    from torch.distributed.tensor.parallel import ColwiseParallel as Col, RowwiseParallel as Row

    return {"attn.q": Col(), "attn.k": Col(), "attn.v": Col(), "attn.o": Row(), "mlp.up": Col(), "mlp.down": Row()}
