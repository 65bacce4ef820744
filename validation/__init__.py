"""Dataset validation with Great Expectations: one runner (``validation.gx_run``) runs a task's
validation plan with the suite it names, a table against its reviewed expectations file
(``validation.suite``) or a text corpus (``validation.text_suite``).

Importing this package is cheap and imports no suite: pandas and great_expectations load inside
the functions.
"""

import tasks  # noqa: F401 - the tasks' config options join core.config's schema before a config loads
