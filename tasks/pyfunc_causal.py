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
given the text as its prompt, as the evaluation scores (``pyfunc_common.score_records``).
"""

import sys

import mlflow
import pandas as pd
import torch

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402


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
        self.model = common.load_weights(AutoModelForCausalLM, folder)

    def predict(self, context, model_input, params=None):
        params, texts = params or {}, common.texts(model_input)
        if common.method(params, ("generate", "score")) == "score":
            completions = model_input.get("completion") if isinstance(model_input, pd.DataFrame) else None
            records = [(t,) for t in texts] if completions is None else list(zip(texts, completions))
            return common.scores(*common.score_records(self.model, self.tok, records, self.max_length))
        return pd.Series([self._generate(t, int(params.get("max_new_tokens") or 32),
                                         float(params.get("temperature") or 0.0)) for t in texts], dtype=object)

    def _generate(self, text, max_new_tokens, temperature):
        ids = torch.tensor([common.token_ids(self.tok, text, True)[-self.max_length:]], dtype=torch.long)
        sample = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=max_new_tokens, pad_token_id=self.tok.pad_token_id, **sample)
        return self.tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


mlflow.models.set_model(TextGenerator())
