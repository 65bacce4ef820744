"""A table's free-text column (a ticket's body, a review, a note), recognised by ``trainflow init``.

As a category every new text is unseen and becomes "other", so the column would teach the table
model nothing that holds at inference while looking like a feature. ``init`` leaves it out
(``dataset.exclude``) and says so, pointing at ``trainflow init --pretrained``, which fine-tunes a
text model on it (``text_classification``, beside a TF-IDF + logistic-regression baseline). A hashed
n-gram bag inside the table model was weighed and not taken: it would add a text encoding to the
table's train and serve paths, its expectations and its tree baseline, for a signal that the text
task learns better from the same column.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

# A column is free text when most values differ and a value is a phrase, not a code or a name.
MIN_ROWS = 10
MIN_DISTINCT_SHARE = 0.5
MIN_MEAN_WORDS = 3.0
MIN_MEAN_CHARS = 20.0


def free_text_reason(s: pd.Series) -> str | None:
    """Why the column ``s`` is free text (multi-word strings, most of them distinct), or None."""
    import pandas as pd

    if not (pd.api.types.is_object_dtype(s.dtype) or pd.api.types.is_string_dtype(s.dtype)):
        return None
    values = s.dropna()
    values = values[values.map(lambda v: isinstance(v, str))]
    if len(values) < MIN_ROWS:
        return None
    distinct = values.nunique() / len(values)
    words = float(values.str.split().str.len().mean())
    chars = float(values.str.len().mean())
    if distinct < MIN_DISTINCT_SHARE or words < MIN_MEAN_WORDS or chars < MIN_MEAN_CHARS:
        return None
    return (f"free text ({words:.1f} words a row on average, {distinct:.0%} of rows distinct): as a category every "
            "new text would be 'other', so it is left out; `trainflow init --pretrained FOLDER` fine-tunes a text "
            "model on it")
