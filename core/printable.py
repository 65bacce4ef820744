"""Names that come from data (files, columns, classes) printed as data, not as text: a control
character in a name must not start a new line of a report or move the terminal's cursor."""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, the Unicode line and paragraph separators and the bidirectional marks
# and overrides (which reorder what a terminal shows).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(value: object) -> str:
    """``str(value)`` with each unsafe character written as its escape (``\\n``, ``\\x1b``, ``\\u202e``)."""
    text = str(value)
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: _NAMED.get(m.group()) or (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                                            else f"\\u{ord(m.group()):04x}"), text)
