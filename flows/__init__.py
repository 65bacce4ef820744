"""Prefect flows and tasks, the deployments' entry points and the CLI: thin shells over the rooms below."""
