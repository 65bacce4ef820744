"""The table tasks' networks (torch): ``Sequential(TableInput, core)``.

``TableInput`` takes the encoded row, so the exported program needs nothing fitted outside itself:
a numeric column is mapped by its train statistics (``quantile``: piecewise linear onto normal
scores, ``robust`` or ``standard``), NaN becomes 0 with a missing-indicator input, and with
``periodic`` each value is embedded as PLR (Gorishniy et al. 2022); a category's code selects an
embedding. ``model.kind``: ``tabular`` (an MLP, the default), ``mlp``, ``cnn`` (over the square
image all-numeric features form) or ``model.factory(n_inputs, n_outputs, **model.kwargs)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from core.config import ModelConfig
from tasks.encoding import FIRST_CODE


def resolved(model: ModelConfig) -> tuple[str, str, bool]:
    """(network kind, numeric transform, periodic embeddings) that ``model`` means for a table: by
    default ``tabular``, with quantile transforms and PLR; standard and no PLR for the others."""
    kind = "factory" if model.factory is not None else (model.kind or "tabular")
    numeric = model.numeric if model.numeric != "auto" else ("quantile" if kind == "tabular" else "standard")
    periodic = model.periodic if model.periodic is not None else kind == "tabular"
    return kind, numeric, periodic


class Affine(nn.Module):
    """``x * scale + shift``: a regression's standardised output back in the target's units."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.register_buffer("shift", torch.tensor(float(shift)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.shift


class Periodic(nn.Module):
    """PLR per column, ``frequencies`` learned ``c`` (initialised N(0, ``scale``)): ``[B, F] -> [B, F * dim]``."""

    def __init__(self, n: int, frequencies: int, scale: float, dim: int):
        super().__init__()
        self.c = nn.Parameter(torch.randn(n, frequencies) * scale)
        bound = 1 / math.sqrt(2 * frequencies)
        self.weight = nn.Parameter(torch.empty(n, 2 * frequencies, dim).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(n, dim).uniform_(-bound, bound))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        a = 2 * math.pi * v[..., None] * self.c
        h = torch.einsum("bfk,fkd->bfd", torch.cat([torch.cos(a), torch.sin(a)], -1), self.weight) + self.bias
        return torch.relu(h).flatten(1)


class TableInput(nn.Module):
    """Encoded columns ``[B, len(columns)]`` -> features ``[B, out_features]``. ``columns``: the fitted
    columns; ``indicators``: a missing-indicator per numeric column with nulls in train; ``periodic``:
    ``{"frequencies", "scale", "dim"}`` for PLR embeddings, or None."""

    def __init__(self, columns: list[dict], numeric: str = "standard", indicators: bool = True,
                 periodic: dict | None = None, embedding_dim: int = 16):
        super().__init__()
        num = [i for i, c in enumerate(columns) if c["kind"] == "numeric"]
        cat = [i for i, c in enumerate(columns) if c["kind"] == "categorical"]
        self.numeric = numeric
        self.register_buffer("num_idx", torch.tensor(num, dtype=torch.long))
        self.register_buffer("cat_idx", torch.tensor(cat, dtype=torch.long))
        ncols = [columns[i] for i in num]
        if numeric == "quantile":
            k = max((len(c["knots"]) for c in ncols), default=1)
            knots, widths, slopes = torch.zeros(len(ncols), k), torch.zeros(len(ncols), max(k - 1, 1)), \
                torch.zeros(len(ncols), max(k - 1, 1))
            first = torch.zeros(len(ncols))
            for j, c in enumerate(ncols):
                q, z = torch.tensor(c["knots"], dtype=torch.float64), torch.tensor(c["scores"], dtype=torch.float64)
                knots[j, :len(q)], knots[j, len(q):] = q.float(), q[-1].float()
                first[j] = float(z[0])
                if len(q) > 1:
                    w = q[1:] - q[:-1]
                    widths[j, :len(w)] = w.float()
                    slopes[j, :len(w)] = torch.where(w > 0, (z[1:] - z[:-1]) / w.clamp_min(1e-300), 0).float()
            self.register_buffer("knots", knots[:, :-1] if k > 1 else knots)
            self.register_buffer("widths", widths)
            self.register_buffer("slopes", slopes)
            self.register_buffer("first", first)
        else:
            centre = [c["median"] if numeric == "robust" else c["mean"] for c in ncols]
            scale = [c["iqr"] if numeric == "robust" else c["std"] for c in ncols]
            self.register_buffer("centre", torch.tensor(centre, dtype=torch.float32))
            self.register_buffer("inv_scale", 1.0 / torch.tensor([s if s > 0 else 1.0 for s in scale],
                                                                  dtype=torch.float32))
        flagged = [j for j, c in enumerate(ncols) if indicators and c.get("nulls", 0) > 0]
        self.register_buffer("ind_idx", torch.tensor(flagged, dtype=torch.long))
        self.periodic = Periodic(len(ncols), periodic["frequencies"], periodic["scale"], periodic["dim"]) \
            if periodic is not None and ncols else None
        sizes = [len(columns[i]["values"]) + FIRST_CODE for i in cat]
        offsets = [sum(sizes[:j]) for j in range(len(sizes))]
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.long))
        self.register_buffer("top", torch.tensor([s - 1 for s in sizes], dtype=torch.float32))
        self.embed = nn.Embedding(sum(sizes), embedding_dim) if sizes else None
        per_numeric = periodic["dim"] if self.periodic is not None else 1
        self.out_features = len(ncols) * per_numeric + len(flagged) + len(cat) * (embedding_dim if sizes else 0)

    def transform(self, v: torch.Tensor) -> torch.Tensor:
        """Numeric values (no NaN) ``[B, Fn]`` mapped by the fitted transform."""
        if self.numeric == "quantile":
            steps = torch.minimum((v[..., None] - self.knots).clamp_min(0), self.widths)
            return self.first + (steps * self.slopes).sum(-1)
        return (v - self.centre) * self.inv_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.num_idx.numel():
            v = x.index_select(1, self.num_idx)
            nan = torch.isnan(v)
            z = torch.where(nan, torch.zeros_like(v), self.transform(torch.where(nan, torch.zeros_like(v), v)))
            parts.append(self.periodic(z) if self.periodic is not None else z)
            if self.ind_idx.numel():
                parts.append(nan.index_select(1, self.ind_idx).to(z.dtype))
        if self.embed is not None:
            codes = x.index_select(1, self.cat_idx)
            codes = torch.minimum(torch.nan_to_num(codes, nan=0.0).clamp_min(0), self.top).long() + self.offsets
            parts.append(self.embed(codes).flatten(1))
        return torch.cat(parts, 1)


def _mlp(n_in: int, n_out: int, hidden: int, layers: int, dropout: float, every: bool) -> nn.Sequential:
    """``layers`` hidden Linear + ReLU blocks; dropout after each (``every``) or after the first."""
    blocks: list[nn.Module] = []
    for i in range(layers):
        blocks += [nn.Linear(n_in if i == 0 else hidden, hidden), nn.ReLU()]
        if every or i == 0:
            blocks.append(nn.Dropout(dropout))
    return nn.Sequential(*blocks, nn.Linear(hidden, n_out))


def build_core(model: ModelConfig, n_in: int, n_out: int) -> nn.Module:
    """The network between the input layer's ``n_in`` features and the ``n_out`` outputs."""
    kind, _, _ = resolved(model)
    if kind == "factory":
        from tasks.factory import factory_module

        return factory_module(model.factory, n_in, n_out, **model.kwargs)
    if kind in ("tabular", "mlp"):
        return _mlp(n_in, n_out, model.hidden, model.layers, model.dropout, every=kind == "tabular")
    side = math.isqrt(n_in)
    if side * side != n_in:
        raise ValueError(f"model.kind: cnn needs a square number of numeric features without missing values "
                         f"(an image), got {n_in} inputs; use tabular or mlp")
    c1, c2 = model.channels
    pooled = c2 * (side // 2) * (side // 2)
    return nn.Sequential(nn.Unflatten(1, (1, side, side)), nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Dropout(model.dropout), nn.Linear(pooled, model.hidden), nn.ReLU(),
                         nn.Linear(model.hidden, n_out))


def table_network(model: ModelConfig, columns: list[dict], n_out: int) -> nn.Sequential:
    """``Sequential(TableInput, core)`` for fitted ``columns`` and ``n_out`` outputs. A cnn takes
    standardised numeric columns only (no indicators: its inputs are the image's pixels)."""
    kind, numeric, periodic = resolved(model)
    if kind == "cnn":
        cats = [c["name"] for c in columns if c["kind"] == "categorical"]
        if cats:
            raise ValueError(f"model.kind: cnn takes numeric pixels; categorical column(s) {cats[:5]}: use tabular")
    plr = {"frequencies": model.frequencies, "scale": model.frequency_scale, "dim": model.embedding_dim} \
        if periodic else None
    first = TableInput(columns, numeric, indicators=kind != "cnn", periodic=plr, embedding_dim=model.embedding_dim)
    return nn.Sequential(first, build_core(model, first.out_features, n_out))
