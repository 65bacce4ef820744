"""Dataset validation with Great Expectations: suites built from ``DatasetConfig``.

Importing this package is cheap: pandas and great_expectations load inside the functions.
"""

from validation.report import summary_markdown
from validation.suite import load_splits, validate_dataset

__all__ = ["load_splits", "validate_dataset", "summary_markdown"]
