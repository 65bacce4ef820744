"""Low-rank adapters (peft LoRA) on a pretrained Hugging Face model, for both HF tasks.

``pretrained.lora: {r, alpha, dropout, target_modules}`` wraps the loaded model: the base weights
are frozen and only the adapters' A and B matrices train. The exported model is the merged one
(``merged``: W + (alpha / r) * B @ A folded into each adapted layer, adapters removed), so the
registered weights are plain ``transformers`` weights and loading them needs no peft.
"""

from __future__ import annotations

# What the task's model head is to peft (its ``TaskType``).
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS"}


def with_lora(model, lora, head: str):
    """``model`` wrapped by peft with adapters as ``lora`` (a ``core.config.LoraConfig``) says; ``head``:
    ``causal_lm`` or ``sequence_classification`` (a classifier's new head trains in full too: peft's
    ``modules_to_save``). Empty ``target_modules``: peft's default for the architecture."""
    import warnings

    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules) or None, task_type=TASK_TYPES[head])
    with warnings.catch_warnings():  # peft's notes on GPT-2's Conv1D layout and a renamed attribute: not the user's
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(model, config)


def is_lora(model) -> bool:
    """Whether ``model`` carries peft adapters (without importing peft for a plain model)."""
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


def merged(model):
    """The plain ``transformers`` model with the adapters folded into its weights (a copy: ``model``
    keeps its adapters); a model without adapters as it is."""
    import copy

    return copy.deepcopy(model).merge_and_unload() if is_lora(model) else model
