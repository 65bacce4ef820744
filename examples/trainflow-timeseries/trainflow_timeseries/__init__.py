"""trainflow-timeseries: an example package that brings its own task to trainflow.

It registers ``sequence-forecast`` under the ``trainflow.tasks`` entry-point group (see
``pyproject.toml``): one-step forecasting of a window of a series, with its own data generator
(``data``), networks (``model``), metrics (``metrics``) and task (``task.SequenceForecast``).
Nothing is imported here, so listing the entry point costs nothing.
"""
