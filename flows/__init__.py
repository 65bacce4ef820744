"""Prefect flows and tasks, the deployments' entry points and the CLI: thin shells over the rooms below."""

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads
