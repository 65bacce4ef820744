"""The byte-level language model task: a JSON Lines text corpus -> a decoder-only transformer
(``tasks.lm_net``) -> a text-scoring pyfunc (``tasks/pyfunc_lm.py``), gated on eval perplexity."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from tasks.base import Metric, ModelSpec, ParallelPlan, Task, ValidationPlan, load_program
from tasks.text import Corpus, corpus_files

if TYPE_CHECKING:
    from core.config import PipelineConfig

# Bump when tasks/lm_eval.py's metrics change: recorded champion scores then stop matching.
LM_METRICS_VERSION = 1
PYFUNC_FILE = Path(__file__).with_name("pyfunc_lm.py")


class LanguageModel(Corpus, Task):
    name = "lm"
    metrics = (Metric("loss", False), Metric("perplexity", False, relative=True), Metric("bits_per_byte", False),
               Metric("latency_p95_ms", False))
    champion_metrics = ("perplexity",)
    primary = None
    metrics_version = LM_METRICS_VERSION

    def evaluator(self):
        from tasks import lm_eval

        return lm_eval

    def loaded_model(self) -> type:
        from tasks.lm_eval import TextScorer

        return TextScorer

    def recorded_keys(self) -> tuple[str, ...]:
        return ("loss", "perplexity", "bits_per_byte", "n_tokens", "n_docs")

    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        text = cfg.dataset.text
        if text is None:
            raise ConfigError("dataset.text: required for the lm task (the corpus files and windows)")
        if cfg.model.kind != "lm":
            raise ConfigError(f"model.kind: the lm task needs 'lm', got {cfg.model.kind!r}")
        t, m = cfg.training, cfg.model
        if m.d_model % m.n_heads:
            raise ConfigError(f"model.d_model: must be divisible by model.n_heads ({m.n_heads}), got {m.d_model}")
        if t.strategy in ("tp", "hybrid") and (m.n_heads % t.parallel.tp or m.d_ff % t.parallel.tp):
            raise ConfigError(f"training.parallel.tp: {t.parallel.tp} must divide model.n_heads ({m.n_heads}) "
                              f"and model.d_ff ({m.d_ff})")
        if t.strategy == "pp" and t.parallel.pp > m.n_layers:
            raise ConfigError(f"training.parallel.pp: {t.parallel.pp} stages for model.n_layers {m.n_layers}: "
                              "each stage needs at least one layer")
        if cfg.model.seq_len != text.seq_len:
            raise ConfigError(f"dataset.text.seq_len: {text.seq_len} differs from model.seq_len {cfg.model.seq_len}; "
                              "windows must fit the model")
        if cfg.model.vocab_size != 256:
            raise ConfigError(f"model.vocab_size: must be 256 for byte-level text, got {cfg.model.vocab_size}")
        if "perplexity" not in cfg.gates.thresholds:
            raise ConfigError("gates.thresholds.perplexity: required for the lm task")

    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        files = list(corpus_files(cfg, root).values())
        return ValidationPlan("validation.text_suite", files, {"dataset": cfg.dataset, "root": Path(root)})

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        from tasks.text import load_text_splits

        return load_text_splits(cfg.dataset, root, seed)

    def build_model(self, cfg: "PipelineConfig", info):
        from tasks.lm_net import ByteLM

        m = cfg.model
        return ByteLM(vocab_size=m.vocab_size, seq_len=m.seq_len, d_model=m.d_model, n_layers=m.n_layers,
                      n_heads=m.n_heads, d_ff=m.d_ff, dropout=m.dropout)

    def example_input(self, cfg: "PipelineConfig", info, batch: int = 2):
        import torch

        return torch.zeros(batch, cfg.model.seq_len, dtype=torch.long)

    def parallel_plan(self, cfg: "PipelineConfig") -> ParallelPlan | None:
        from tasks import lm_net

        return ParallelPlan(lambda model: list(model.layers.values()), lm_net.tp_plan, lm_net.stage_layers,
                            lm_net.split_stage)

    def batch_tokens(self, x):
        return x.numel()  # windows of seq_len bytes, none padded

    def loss(self, out, y, reduction: str = "mean"):
        from tasks.lm_net import token_loss

        return token_loss(out, y, reduction)

    def val_correct(self, out, y) -> float:
        return (out.argmax(-1) == y).sum().item()

    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        return self.eval_key(cfg, root, kind="text")

    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        import pandas as pd

        from tasks.text import read_documents

        docs = read_documents(corpus_files(cfg, root)["eval"])[:3]
        example = pd.DataFrame({"text": [d[:512].decode("utf-8", "ignore") for _, d in docs]})
        seq = cfg.dataset.text.seq_len
        meta = {"format": "torch.export", "input_dtype": "int64", "seq_len": int(seq), "vocab": "utf-8 bytes"}
        return ModelSpec(PYFUNC_FILE, meta, [("text", "string")],
                         [("loss", "double"), ("perplexity", "double"), ("n_tokens", "long")], example,
                         metadata={"trainflow_kind": "lm"})

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        import torch

        seq = spec.meta["seq_len"]
        program = load_program(model_pt2)
        with torch.inference_mode():
            logits = program(torch.zeros((1, seq), dtype=torch.int64))
        if tuple(logits.shape) != (1, seq, 256):
            raise ValueError(f"{model_pt2}: maps [1, {seq}] tokens to {list(logits.shape)}, "
                             f"expected [1, {seq}, 256] byte logits")
