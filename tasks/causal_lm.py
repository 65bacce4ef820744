"""The ``causal_lm`` task: fine-tune a pretrained Hugging Face decoder (``pretrained.path``, a local
folder checked by ``tasks.hf_folder``) on JSON Lines text, optionally with LoRA (``tasks.hf_lora``).

Data: ``dataset.path`` + ``dataset.text``'s ``train_file`` / ``eval_file`` / ``holdout_fraction``
(the byte LM's keys; its ``seq_len`` and ``stride`` are not read: ``pretrained.max_length`` is the
sequence length). Records are ``text`` (packed) or ``prompt`` + ``completion`` (loss on the completion
only): ``tasks.causal_lm_data``. Evaluation: token-weighted held-out loss and perplexity of the
exported model (``tasks.causal_lm_eval``); the gate compares perplexity with the champion's, as the
``lm`` task does. The registered model is ``tasks/pyfunc_causal.py``: prompt text in, generated text out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from tasks.base import Metric, ModelSpec, Task, ValidationPlan
from tasks.causal_lm_eval import EXPORT_DIR
from tasks.info import DataInfo
from tasks.text import Corpus, corpus_files

if TYPE_CHECKING:
    from core.config import PipelineConfig

# Bump when tasks/causal_lm_eval.py's scoring changes: recorded champion scores then stop matching.
METRICS_VERSION = 1
PYFUNC_FILE = Path(__file__).with_name("pyfunc_causal.py")


@dataclasses.dataclass(frozen=True)
class CausalInfo(DataInfo):
    """The model folder (absolute) and what the sequences were cut to."""

    folder: str = ""
    max_length: int = 0
    pairs: bool = False


class CausalLM(Corpus, Task):
    name = "causal_lm"
    metrics = (Metric("loss", False), Metric("perplexity", False, relative=True), Metric("latency_p95_ms", False))
    champion_metrics = ("perplexity",)
    primary = None
    info_type = CausalInfo
    # Generation defaults of the registered model (``predict(df, params=...)``): greedy at temperature 0.
    predict_params = [("max_new_tokens", "long", 32), ("temperature", "double", 0.0),
                      ("predict_method", "string", "generate")]
    metrics_version = METRICS_VERSION

    def evaluator(self):
        from tasks import causal_lm_eval

        return causal_lm_eval

    def val_accuracy(self, correct: float, n: int) -> float | None:
        return None

    def recorded_keys(self) -> tuple[str, ...]:
        return ("loss", "perplexity", "n_tokens", "n_docs")

    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        p = cfg.pretrained
        if p is None:
            raise ConfigError("pretrained: required for the causal_lm task (pretrained.path: a model folder)")
        if cfg.dataset.text is None:
            raise ConfigError("dataset.text: required for the causal_lm task (train_file, eval_file: JSON Lines)")
        if bool(p.prompt_column) != bool(p.completion_column):
            raise ConfigError("pretrained.prompt_column: set both prompt_column and completion_column for "
                              "prompt/completion pairs, or neither for text")
        if p.pooling != "cls":
            raise ConfigError(f"pretrained.pooling: {p.pooling} is what a text_classification head reads; a causal "
                              "LM's loss reads every token's own state: leave pretrained.pooling out")
        if cfg.model.kind is not None or cfg.model.factory:
            raise ConfigError("model.kind: the causal_lm task's model is the pretrained folder; leave model.kind "
                              "and model.factory out")

    def folder(self, cfg: "PipelineConfig", root: Path) -> Path:
        """The model folder, inside the repository (ConfigError naming ``pretrained.path`` otherwise)."""
        root = Path(root).resolve()
        folder = (root / cfg.pretrained.path).resolve()
        if not folder.is_relative_to(root):
            raise ConfigError(f"pretrained.path: {cfg.pretrained.path!r} leads outside the repository")
        return folder

    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        """The reviewed text expectations ``init --pretrained`` writes (``dataset.expectations_file``),
        else the corpus suite's document bounds (``dataset.text.expectations``)."""
        from tasks.causal_lm_data import columns

        if cfg.dataset.expectations_file is not None:
            from tasks.text_init import text_validation_plan

            text = cfg.dataset.text
            return text_validation_plan(cfg, root, {"train": text.train_file, "test": text.eval_file})
        return ValidationPlan("validation.text_suite", list(corpus_files(cfg, root).values()),
                              {"dataset": cfg.dataset, "root": Path(root), "record": columns(cfg)})

    # -- training --------------------------------------------------------------------------
    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        from tasks.causal_lm_data import tokenized
        from tasks.hf_folder import check_folder
        from tasks.splits import Splits, tensors

        folder = self.folder(cfg, root)
        check_folder(folder)
        arrays = tokenized(cfg, root, seed, folder)
        info = CausalInfo(folder=str(folder), max_length=cfg.pretrained.max_length,
                          pairs=bool(cfg.pretrained.prompt_column))
        return Splits(*(tensors(arrays[f"x_{s}"], arrays[f"y_{s}"]) for s in ("train", "val", "test")), info=info)

    def build_model(self, cfg: "PipelineConfig", info: CausalInfo):
        from tasks.causal_lm_net import CausalLMModule
        from tasks.hf_folder import load_model

        hf = load_model(info.folder, "causal_lm")
        if cfg.pretrained.activation_checkpointing:
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if cfg.pretrained.lora is not None:
            from tasks.hf_lora import with_lora

            hf = with_lora(hf, cfg.pretrained.lora, "causal_lm")
        return CausalLMModule(hf)

    def fsdp_units(self, model) -> list:
        from tasks.hf_folder import transformer_blocks

        return transformer_blocks(model)

    def example_input(self, cfg: "PipelineConfig", info, batch: int = 2):
        import torch

        return torch.ones(batch, 2, cfg.pretrained.max_length, dtype=torch.long)

    def batch_tokens(self, x):
        return x[:, 1].sum()  # the attention mask: the sequences' real tokens

    def loss(self, out, y, reduction: str = "mean"):
        from tasks.causal_lm_net import token_loss

        return token_loss(out, y, reduction)

    def export_files(self, cfg: "PipelineConfig", model, info: CausalInfo, out: Path) -> str:
        """Rank 0: the trained model (adapters merged) as a ``save_pretrained`` folder (safetensors) with
        the tokenizer, ``out/hf_model``; what the registry logs."""
        import shutil

        from tasks.hf_folder import load_tokenizer
        from tasks.hf_lora import merged

        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per shard written: noise in a job's log
        target = Path(out) / EXPORT_DIR
        shutil.rmtree(target, ignore_errors=True)
        hf = merged(model.hf)
        hf.save_pretrained(target, safe_serialization=True)
        load_tokenizer(info.folder).save_pretrained(target)
        return EXPORT_DIR

    # -- evaluation ----------------------------------------------------------------------------
    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        from tasks.causal_lm_data import columns

        return self.eval_key(cfg, root, kind="causal_lm", record=columns(cfg), max_length=cfg.pretrained.max_length)

    def eval_records(self, cfg: "PipelineConfig", root: Path) -> list[tuple[str, ...]]:
        from tasks.causal_lm_data import columns
        from tasks.text import read_records

        return read_records(corpus_files(cfg, root)["eval"], columns(cfg))

    # -- registry ------------------------------------------------------------------------------
    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        import pandas as pd

        prompts = [r[0][:512] for r in self.eval_records(cfg, root)[:3]]
        meta = {"format": "transformers", "max_length": int(cfg.pretrained.max_length)}
        return ModelSpec(PYFUNC_FILE, meta, [("text", "string")], [(None, "string")],
                         pd.DataFrame({"text": prompts}), metadata={"trainflow_kind": self.name}, checked=True,
                         optional_inputs=["completion"], params=list(self.predict_params),
                         requirements=["transformers", "tokenizers", "safetensors"])

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        from tasks.hf_folder import check_folder

        check_folder(model_pt2)
