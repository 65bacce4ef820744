"""MLflow pyfunc wrapper of a fine-tuned causal LM (models-from-code file): prompt text in, generated
text out.

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other
project code. The model folder (safetensors weights, config, tokenizer files) is the ``model``
artifact, whose files the registry hashed at registration; it loads offline, from that folder only,
never with remote code.

Input: a DataFrame with a ``text`` column (the prompts), or a list of strings. Output: the generated
continuation of each prompt (the prompt itself left out). ``params``: ``max_new_tokens`` (32),
``temperature`` (0 or absent: greedy; above 0: sampling) and ``predict_method``: ``generate`` (the
default) or ``score``, which returns ``loss`` (nats per learned token), ``perplexity`` and
``n_tokens`` per row: of the text's tokens, or, with a ``completion`` column, of the completion's
given the text as its prompt, in the windows of ``tasks.causal_lm_data.record_targets`` (kept in
step by a test).
"""

import sys

import mlflow
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402

IGNORE = -100


def _ids(tok, text, special):
    return list(tok(text, add_special_tokens=special)["input_ids"])


def _windows(tok, record, max_length):
    eos = tok.eos_token_id
    if len(record) == 1:
        ids = _ids(tok, record[0], True)
        if eos is not None and (not ids or ids[-1] != eos):
            ids.append(eos)
        return [(ids[s:s + n], ids[s + 1:s + n + 1]) for s in range(0, max(len(ids) - 1, 0), max_length)
                for n in [min(max_length, len(ids) - 1 - s)]]
    prompt = _ids(tok, record[0], True)
    ids = (prompt + _ids(tok, record[1], False) + ([eos] if eos is not None else []))[:max_length + 1]
    targets = [t if i + 1 >= len(prompt) else IGNORE for i, t in enumerate(ids[1:])]
    return [(ids[:-1], targets)] if any(t != IGNORE for t in targets) else []


class TextGenerator(mlflow.pyfunc.PythonModel):
    """Generated continuations of a DataFrame's ``text`` column (or their scores)."""

    def load_context(self, context):
        common.offline()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.max_length = int(common.meta(context)["max_length"])
        folder = context.artifacts["model"]
        kwargs = {"local_files_only": True, "trust_remote_code": False}
        self.tok = AutoTokenizer.from_pretrained(folder, **kwargs)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, **kwargs).eval()

    def predict(self, context, model_input, params=None):
        params, texts = params or {}, common.texts(model_input)
        if common.method(params, ("generate", "score")) == "score":
            completions = model_input.get("completion") if isinstance(model_input, pd.DataFrame) else None
            return self._score([(t,) for t in texts] if completions is None else list(zip(texts, completions)))
        return pd.Series([self._generate(t, int(params.get("max_new_tokens") or 32),
                                         float(params.get("temperature") or 0.0)) for t in texts], dtype=object)

    def _generate(self, text, max_new_tokens, temperature):
        ids = torch.tensor([_ids(self.tok, text, True)[-self.max_length:]], dtype=torch.long)
        sample = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=max_new_tokens, pad_token_id=self.tok.pad_token_id, **sample)
        return self.tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)

    def _score(self, records):
        loss_sum, n_tokens = np.zeros(len(records)), np.zeros(len(records), dtype=np.int64)
        with torch.inference_mode():
            for i, record in enumerate(records):
                for x, tg in _windows(self.tok, record, self.max_length):
                    logits = self.model(input_ids=torch.tensor([x]), use_cache=False).logits.float()
                    y = torch.tensor([tg])
                    loss_sum[i] += float(F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE,
                                                         reduction="sum"))
                    n_tokens[i] += int((y != IGNORE).sum())
        return common.scores(loss_sum, n_tokens)


mlflow.models.set_model(TextGenerator())
