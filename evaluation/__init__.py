"""Metrics on the held-out split, champion comparison, gate decisions and reports."""

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads
