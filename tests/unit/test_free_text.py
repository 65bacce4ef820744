"""A free-text column in a plain table (no --pretrained): ``trainflow init`` recognises it, says so and
leaves it out, never takes it as a category; short codes and names stay features."""

from __future__ import annotations

import numpy as np
import pandas as pd

from flows.init import choice_lines
from tasks import get_task
from tasks.free_text import free_text_reason

WORDS = "the parcel arrived late and the box was broken please refund my card again thanks".split()


def tickets(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    notes = [" ".join(rng.choice(WORDS, int(rng.integers(4, 15)))) for _ in range(n)]
    notes[3] = notes[4] = "call me back"  # repeated and missing: not an identifier, still free text
    notes[5] = None
    return pd.DataFrame({"note": notes, "city": rng.choice(["New York", "Paris", "Oslo"], n),
                         "amount": rng.normal(50, 10, n), "label": rng.choice(["yes", "no"], n)})


def test_free_text_column_is_left_out_and_said():
    choices = get_task("classification").init_choices({"train": tickets()}, "label", presplit=False)
    assert set(choices["exclude"]) == {"note"} and "note" not in choices["categorical"]
    why = choices["exclude"]["note"]
    assert why.startswith("free text (") and "would be 'other'" in why and "init --pretrained" in why
    assert any(line.startswith("excluded:     note: free text") for line in choice_lines(choices))


def test_codes_names_and_short_labels_are_not_free_text():
    rng = np.random.default_rng(1)
    assert free_text_reason(pd.Series(rng.choice(["New York", "Paris", "Oslo"], 100))) is None  # few values
    assert free_text_reason(pd.Series([f"SKU-{i}" for i in range(100)])) is None  # one word: a code
    assert free_text_reason(pd.Series([f"Mr John Smith {i}" for i in range(100)])) is None  # short
    assert free_text_reason(pd.Series(np.arange(100))) is None
    assert free_text_reason(pd.Series(["a long enough sentence of words"] * 3)) is None  # too few rows
