"""``DataInfo``: what a task fitted on its train split; no heavy imports, for the rooms that pass it on."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class DataInfo:
    """What a task's model, export and scoring are built from (``Task.info``), stored as JSON by the
    caches. A task with nothing to fit keeps this empty one; a table's is ``tasks.tabular.TableInfo``."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "DataInfo":
        return cls(**data)
