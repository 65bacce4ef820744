"""The reviewed expectations file of a table: one entry per column, written by ``trainflow init``
from a profile of the data, reviewed and committed by the user, read by validation and training.

    version: 1
    label: target
    columns:                      # every column of the data, in file order
      - {name: alcohol, type: float, min: 10.2, max: 15.6, nulls: false}
      - {name: target, type: string, values: [class_0, class_1, class_2], nulls: false}
    rows: {train: [100, 400], test: [20, 100]}
    class_share: [0.2, 0.5]       # classification: each class's share of a split

``type``: integer | float | string | boolean. ``min``/``max`` bound a numeric column (null: no
bound); ``values`` is the allowed set of a categorical column (for the classification label it
is the class set, in the order of the model's outputs). ``nulls: false`` forbids nulls.
No torch, pandas or YAML work at import.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from core.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ColumnExpectation(_Strict):
    name: str = Field(min_length=1)
    type: Literal["integer", "float", "string", "boolean"]
    min: int | float | None = None
    max: int | float | None = None
    values: list[Any] | None = None
    nulls: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> "ColumnExpectation":
        for key in ("min", "max"):
            v = getattr(self, key)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{key}: must be a finite number, got {v!r}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min: {self.min} is above max {self.max}")
        if (self.min is not None or self.max is not None) and self.type not in ("integer", "float"):
            raise ValueError(f"min: bounds are for integer or float columns, {self.name!r} is {self.type}")
        if self.values is not None and len(set(map(str, self.values))) != len(self.values):
            raise ValueError("values: duplicates")
        return self


class TableExpectations(_Strict):
    version: Literal[1] = 1
    label: str | None = None
    columns: list[ColumnExpectation] = Field(min_length=1)
    rows: dict[Literal["train", "test"], tuple[int, int]] = {}
    class_share: tuple[float, float] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "TableExpectations":
        names = self.names
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"columns: duplicate names {dup}")
        if self.label is not None and self.label not in names:
            raise ValueError(f"label: {self.label!r} is not one of the columns")
        for split, (lo, hi) in self.rows.items():
            if lo < 0 or lo > hi:
                raise ValueError(f"rows.{split}: needs 0 <= lower <= upper, got [{lo}, {hi}]")
        if self.class_share is not None:
            lo, hi = self.class_share
            if not 0 <= lo <= hi <= 1:
                raise ValueError(f"class_share: needs 0 <= lower <= upper <= 1, got [{lo}, {hi}]")
        return self

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> ColumnExpectation | None:
        return next((c for c in self.columns if c.name == name), None)

    @property
    def classes(self) -> list[Any] | None:
        """The label column's allowed values (the class set, in output order), or None."""
        col = self.column(self.label) if self.label else None
        return list(col.values) if col is not None and col.values is not None else None

    def to_yaml(self, header: str = "") -> str:
        import yaml

        data = self.model_dump(mode="json", exclude_none=True)
        for col in data["columns"]:
            for key in set(col) & {"min", "max"}:  # 16.0 -> 16: the reviewer reads the bound as written
                v = col[key]
                col[key] = int(v) if isinstance(v, float) and v.is_integer() and abs(v) < 2**53 else v
        rows = data.pop("rows", {})
        share = data.pop("class_share", None)
        # One flow-style line per column and range: a reviewer reads a table, not a tree.
        body = yaml.safe_dump({k: v for k, v in data.items() if k != "columns"}, sort_keys=False)
        if rows:
            body += "rows:\n" + "".join(f"  {k}: [{lo}, {hi}]\n" for k, (lo, hi) in rows.items())
        if share is not None:
            body += f"class_share: [{share[0]}, {share[1]}]\n"
        cols = "".join(f"  - {yaml.safe_dump(c, default_flow_style=True, sort_keys=False, width=10**6).strip()}\n"
                       for c in data["columns"])
        return header + body + "columns:\n" + cols


def load_expectations(path: str | Path, model: type[_Strict] = TableExpectations,
                      writer: str = "`trainflow init`") -> Any:
    """Read and check an expectations file against ``model`` (``writer``: the command that writes one).
    Raises ConfigError naming the file and the key path."""
    from core.config import _format_errors, load_yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read expectations file {path}: {exc.strerror or exc}; "
                          f"{writer} writes one") from None
    try:
        return model.model_validate(load_yaml(text))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ValidationError as err:
        raise ConfigError(f"{path}: {_format_errors(err, model)}") from None
