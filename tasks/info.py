"""``DataInfo``: what a task fitted on its train split (``Task.info``); no heavy imports, so the
rooms that only pass it on (the registry, validation) stay light."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class DataInfo:
    """What a task fitted on its train split, which its model, export and scoring are built from
    (``Task.info``, ``Splits.info``): typed fields, stored as JSON by the caches (``to_json`` /
    ``from_json``). A task with nothing to fit keeps this empty one; a table's is
    ``tasks.tabular.TableInfo``."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "DataInfo":
        return cls(**data)
