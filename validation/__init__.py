"""Dataset validation with Great Expectations: a table against its reviewed expectations file
(``validation.suite``), a text corpus against its config (``validation.text_suite``).

Importing this package is cheap: pandas and great_expectations load inside the functions.
"""

from validation.report import summary_markdown
from validation.suite import table_data_hash, table_suite_hash, validate_table

__all__ = ["validate_table", "table_suite_hash", "table_data_hash", "summary_markdown"]
