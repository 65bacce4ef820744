"""trainflow-timeseries: an example package that brings its own task, ``sequence-forecast``, to trainflow
through the ``trainflow.tasks`` entry point (``pyproject.toml``). Nothing is imported here, so listing
the entry point costs nothing.
"""
