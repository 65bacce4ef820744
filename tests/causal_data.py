"""A tiny causal-LM project for tests: JSON Lines with a learnable pattern (a colour follows each
fruit; a number's successor completes a prompt) and a tiny GPT-2-like folder trained on its text."""

from __future__ import annotations

import json
from pathlib import Path

FRUITS = {"apple": "red", "banana": "yellow", "lime": "green", "plum": "purple", "orange": "orange",
          "grape": "green", "cherry": "red", "lemon": "yellow"}


def lines(n: int, seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    names = sorted(FRUITS)
    return [" ".join(f"the {f} is {FRUITS[f]}." for f in rng.sample(names, 3)) + f" item {i}" for i in range(n)]


def pairs(n: int, seed: int) -> list[tuple[str, str]]:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(n):
        f = rng.choice(sorted(FRUITS))
        out.append((f"q{i}: what colour is the {f}?", f" the {f} is {FRUITS[f]}."))
    return out


def write_project(root: Path, kind: str = "text", n_train: int = 240, n_eval: int = 40, folder: str = "chat") -> dict:
    """``data/<folder>/{train,val}.jsonl`` (``kind``: text or pairs) and ``models/tiny-gpt`` (made once,
    on the first data's text) under ``root``; returns the config dict of a causal_lm pipeline over them."""
    from tests.hf_models import tiny_decoder

    data = Path(root) / "data" / folder
    data.mkdir(parents=True, exist_ok=True)
    corpus = []
    for name, n, seed in (("train.jsonl", n_train, 1), ("val.jsonl", n_eval, 2)):
        if kind == "text":
            recs = [{"text": t} for t in lines(n, seed if name == "train.jsonl" else 10_000 + seed)]
            corpus += [r["text"] for r in recs]
        else:
            recs = [{"prompt": p.replace("q", "q" if name == "train.jsonl" else "e"), "completion": c}
                    for p, c in pairs(n, seed)]
            corpus += [r["prompt"] + r["completion"] for r in recs]
        (data / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    if not (Path(root) / "models" / "tiny-gpt").is_dir():
        tiny_decoder(Path(root) / "models" / "tiny-gpt", corpus, vocab_size=300, positions=64)
    pretrained = {"path": "models/tiny-gpt", "max_length": 32}
    if kind == "pairs":
        pretrained.update(prompt_column="prompt", completion_column="completion")
    return {"name": f"chat-{kind}", "task": "causal_lm", "seed": 0,
            "dataset": {"path": f"data/{folder}", "text": {"train_file": "train.jsonl", "eval_file": "val.jsonl",
                                                      "holdout_fraction": 0.1}},
            "pretrained": pretrained,
            "training": {"epochs": 2, "batch_size": 8, "lr": 0.003, "optimizer": "adamw", "warmup_epochs": 0,
                         "cpu_workers": 2, "strategy": "ddp"},
            "gates": {"thresholds": {"perplexity": 1000.0}}}
