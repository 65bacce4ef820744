"""MLflow tracking and model registry for trainflow.

``registry.store``: tracking set-up and run logging (``configure``, ``start_run``,
``end_run``, ``log_params``, ``log_metrics``, ``log_json``, ``log_file``).
``registry.models``: the pyfunc model of a ``torch.export`` program, its
registered versions and the ``@challenger`` / ``@champion`` aliases.

Importing this package does not import MLflow, torch or pandas.
"""
