"""The table tasks' config options (classification, regression and tasks built on them): how the
columns are read (``dataset.categorical``, ``dates``, ``leak_policy`` ...) and the table networks'
input layer (``model.layers``, ``numeric``, ``periodic`` ...). Registered into ``core.config``'s
schema (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from core.config import Options, register_options


class TableDataset(Options):
    # Numeric (integer) feature columns the model takes as categories (string and boolean columns
    # always are): each value gets a learned embedding. `trainflow init` names the integer columns
    # with few distinct values here and says so.
    categorical: list[str] = []
    # Categories kept per categorical column: the train split's most frequent values; any other
    # value (and one unseen in training) shares the column's "other" embedding.
    max_categories: int = Field(1000, ge=1)
    # Text columns of dates or timestamps and their strftime format ({arrival_date: "%Y-%m-%d"};
    # `trainflow init` finds them): each becomes the numeric ``date_parts`` (hour only where the
    # format has one), in training and inside the registered model, which takes the raw text. A
    # column left out is text like any other (a category).
    dates: dict[str, str] = {}
    # The parts every date column becomes, at least one (to take a column as text instead, leave it
    # out of `dates`).
    date_parts: list[Literal["year", "month", "day", "weekday", "dayofyear", "hour", "days", "missing"]] = Field(
        ["year", "month", "day", "weekday", "dayofyear", "hour", "days", "missing"], min_length=1)
    # Rows found in both train and test: fail validation, or only report them (warn). Left out:
    # warn when trainflow splits one `file` itself (exact duplicate rows then stay on one side),
    # fail for data that comes split.
    leak_policy: Literal["fail", "warn"] | None = None


def check_table_dataset(dataset) -> None:
    """ValueError naming the key when the table keys of ``dataset`` contradict its label."""
    if dataset.label in dataset.categorical:
        raise ValueError(f"categorical: contains the label column {dataset.label!r} (a classification label is "
                         "always a category)")
    for column, fmt in dataset.dates.items():
        if column == dataset.label or column in dataset.categorical:
            raise ValueError(f"dates.{column}: the column is the label or in categorical; a date column is "
                             "one or the other")
        if "%" not in fmt:
            raise ValueError(f"dates.{column}: {fmt!r} is not a strftime format (e.g. \"%Y-%m-%d\")")
    if len(set(dataset.date_parts)) != len(dataset.date_parts):
        raise ValueError(f"date_parts: duplicates in {dataset.date_parts}")


def leak_policy(dataset) -> str:
    """``dataset.leak_policy``, or its default: warn for one file split here, fail for pre-split files."""
    return dataset.leak_policy or ("warn" if dataset.file is not None else "fail")


class TableModel(Options):
    # Hidden layers of the tabular and mlp networks.
    layers: int = Field(2, gt=0)
    # Numeric columns: quantile (piecewise linear onto normal scores), robust ((x - median) / IQR)
    # or standard ((x - mean) / std), fitted on the train split. auto: quantile for tabular,
    # standard for the others.
    numeric: Literal["auto", "quantile", "robust", "standard"] = "auto"
    # PLR embeddings of the numeric columns (periodic features, learned frequencies); left out: on
    # for tabular only.
    periodic: bool | None = None
    frequencies: int = Field(16, gt=0)
    # Standard deviation of the frequencies' initialisation (inputs are ~unit scale after `numeric`).
    frequency_scale: float = Field(0.1, gt=0)
    # Size of each category's embedding and of each numeric column's periodic embedding.
    embedding_dim: int = Field(16, gt=0)


register_options("dataset", TableDataset, check_table_dataset)
register_options("model", TableModel)
