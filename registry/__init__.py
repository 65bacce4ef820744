"""MLflow tracking (``registry.store``) and model registry (``registry.models``: versions, aliases, loading).

Importing this package does not import MLflow, torch or pandas.
"""

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads
