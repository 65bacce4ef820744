"""Short texts with a learnable signal, made here (no download): each class has its own words,
mixed with shared filler, for the text_classification tests and ``benchmarks/finetune.py``."""

from __future__ import annotations

import numpy as np
import pandas as pd

WORDS = {"billing": ["invoice", "refund", "charged", "payment", "price", "card"],
         "bug": ["crash", "error", "broken", "freezes", "exception", "fails"],
         "praise": ["love", "great", "thanks", "awesome", "excellent", "wonderful"]}
FILLER = ["the", "app", "today", "my", "account", "please", "again", "after", "update", "it", "is", "was", "this"]


def tickets(n: int = 300, seed: int = 0, noise: float = 0.1) -> pd.DataFrame:
    """``n`` support tickets: ``text`` (4-12 words, two or three of their class's) and ``category``;
    a share ``noise`` of rows get another class's label (so nothing scores perfectly)."""
    rng = np.random.default_rng(seed)
    classes = sorted(WORDS)
    labels = rng.choice(classes, n)
    texts = []
    for label in labels:
        words = list(rng.choice(FILLER, rng.integers(2, 10))) + list(rng.choice(WORDS[label], rng.integers(2, 4)))
        rng.shuffle(words)
        texts.append(" ".join(words))
    flip = rng.random(n) < noise
    labels = np.where(flip, rng.choice(classes, n), labels)
    return pd.DataFrame({"text": texts, "category": labels.astype(object)})
