"""``TrainState``: what one checkpoint holds, defined once.

The trainer keeps its progress in a ``TrainState``; the checkpointer (``training.checkpoint``)
decides when to save it and the strategy (``training.strategies``) only does the I/O: it writes
``model`` and ``optimizer`` in its own format (``state.pt`` or DCP shards) and ``meta()``
beside them, and reads both back. Nothing else is stored, so this file is the full list:

- model, optimizer: the live objects (the strategy reads/writes their state dicts);
- step (optimizer steps), epoch (epochs complete), cursor (samples of the epoch's global order
  consumed: ``training.batches``), the partial epoch's loss sums, early-stopping state, history;
- RNG: every rank's torch generator state (dropout streams);
- config id, resume id (``PipelineConfig.resume_id``) and data hash: what the run must match;
- the writer: ``layout`` (strategy, world size, model-parallel degrees) and ``plan``
  (dp_size, micro_batch, grad_accum, global_batch, lr, the configured batch).

There is no scheduler state: the LR is a function of samples consumed (epoch + cursor / N,
``training.trainer.lr_factor``) and the writer's LR, so a resize does not jump it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Version of ``meta()``: 2 introduced the global sample cursor (1 held a per-rank batch position).
FORMAT = 2


class StateFormatError(ValueError):
    """A checkpoint whose metadata this version cannot resume from (e.g. written before the cursor)."""


@dataclass
class TrainState:
    """Everything a checkpoint holds; ``meta()`` is the plain part, ``model``/``optimizer`` the live one."""

    model: Any = None
    optimizer: Any = None
    step: int = 0
    epoch: int = 0
    cursor: int = 0
    # Per writer rank: [loss sum, samples] of the epoch so far (its share of the epoch's train loss).
    epoch_sums: list = field(default_factory=list)
    best: float | None = None
    bad_epochs: int = 0
    history: list = field(default_factory=list)  # EpochStats as dicts
    rng: list = field(default_factory=list)  # per writer rank: torch.get_rng_state()
    config_id: str | None = None
    resume_id: str | None = None
    data_md5: str | None = None
    layout: dict = field(default_factory=dict)  # training.layouts.layout_for of the writer
    plan: dict = field(default_factory=dict)  # BatchPlan.describe() + lr + configured [batch, accum]

    _META = ("step", "epoch", "cursor", "epoch_sums", "best", "bad_epochs", "history", "rng", "config_id",
             "resume_id", "data_md5", "layout", "plan")

    def meta(self) -> dict:
        """The plain part, as stored beside the model and optimizer (loadable with weights_only=True).

        A copy: a background write (replicated strategies) pickles it while training goes on and
        appends to the history.
        """
        import copy

        plain = {k: copy.deepcopy(getattr(self, k)) for k in self._META if k != "rng"}
        return {"format": FORMAT, **plain, "rng": list(self.rng)}

    @classmethod
    def from_meta(cls, meta: dict, model=None, optimizer=None) -> "TrainState":
        """The state a checkpoint's ``meta`` describes (its model/optimizer are already loaded in place).

        Raises StateFormatError for metadata of another format (an older trainflow's checkpoint
        held a per-rank position, which cannot be mapped onto the global sample order).
        """
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format", 1) if isinstance(meta, dict) else type(meta).__name__
            raise StateFormatError(
                f"checkpoint metadata format {got!r}, this trainflow reads format {FORMAT} (a global "
                "sample cursor); it was written by an older version: use a fresh --out")
        missing = [k for k in cls._META if k not in meta]
        if missing:
            raise StateFormatError(f"checkpoint metadata lacks {', '.join(missing)}")
        return cls(model=model, optimizer=optimizer, **{k: meta[k] for k in cls._META})

    def identity(self) -> dict:
        """What the checkpoint's completion marker records (read by the launcher without torch)."""
        ident = {"config_id": self.config_id, "data_md5": self.data_md5}
        if self.resume_id is not None:
            ident["resume_id"] = self.resume_id
        if self.layout:
            ident["layout"] = self.layout
        return ident

    def writer(self) -> dict:
        """result.json's ``resized_from`` for a run that resumed this state on another layout."""
        return {"world_size": self.layout.get("world_size"), "strategy": self.layout.get("strategy"),
                **{k: self.plan.get(k) for k in ("dp_size", "micro_batch", "grad_accum", "global_batch")}}
