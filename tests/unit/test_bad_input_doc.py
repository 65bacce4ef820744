"""docs/bad-input.md and docs/security.md carry the refusals the code gives now: their generated blocks
equal a fresh run of scripts/bad_input_doc.py on its tiny bad inputs (in-process)."""

from __future__ import annotations

from tests.conftest import ROOT, load_script


def test_the_generated_refusals_match_the_code():
    script = load_script("bad_input_doc")
    for name, text in script.rendered().items():
        assert (ROOT / "docs" / name).read_text() == text, f"{name} is stale; run: python scripts/bad_input_doc.py"


def test_each_block_is_delimited_for_hand_written_rows_around_it():
    script = load_script("bad_input_doc")
    page = "intro\n<!-- security:generated:start -->\nold\n<!-- security:generated:end -->\n| by hand | row |\n"
    out = script.render("security", page, ["| a | b | c |"])
    assert out.startswith("intro\n<!-- security:generated:start -->\n") and "old" not in out
    assert out.endswith("| a | b | c |\n\n<!-- security:generated:end -->\n| by hand | row |\n")
