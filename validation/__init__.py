"""Dataset validation with Great Expectations: one runner (``validation.gx_run``) runs a task's
validation plan with the suite it names, a table against its reviewed expectations file
(``validation.suite``) or a text corpus (``validation.text_suite``).

Importing this package is cheap and imports no suite: pandas and great_expectations load inside
the functions, and the names below load their module when first used.
"""

from importlib import import_module

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads

_EXPORTS = {
    "run_plan": "validation.gx_run", "data_key": "validation.gx_run", "suite_key": "validation.gx_run",
    "validate_table": "validation.suite", "table_suite_hash": "validation.suite",
    "summary_markdown": "validation.report",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'validation' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
