"""The summary's "registered" line: the aliases a version holds, or why it holds none."""

from __future__ import annotations

from flows.cli import _print_summary, registered_text


def test_a_version_with_aliases_lists_them():
    assert registered_text({"model_name": "m", "model_version": "3", "aliases": ["challenger", "champion"]}) == \
        "m v3 @challenger, @champion"


def test_a_version_left_without_an_alias_by_a_concurrent_run_says_so(capsys):
    """Three runs registering at once: a middle one's @challenger has moved on by the time it reads."""
    s = {"status": "registered", "model_name": "digit-images", "model_version": "2", "aliases": []}
    assert registered_text(s) == "digit-images v2 (no alias: a version registered after it holds @challenger)"
    _print_summary(s)
    err = capsys.readouterr().err
    assert "digit-images v2 (no alias" in err and "v2 @" not in err
