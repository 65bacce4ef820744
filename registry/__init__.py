"""MLflow tracking (``registry.store``) and model registry (``registry.models``: versions, aliases, loading).

Importing this package does not import MLflow, torch or pandas.
"""
