"""xmr.report.readme: generated README sections between marker comments."""

from __future__ import annotations

import pytest

from xmr.core.errors import XmrError
from xmr.report.readme import replace_section, update_section

README = "# t\n\nintro\n\n<!-- xmr:results -->\nold table\n<!-- /xmr:results -->\n\nafter\n"


def test_replaces_only_the_marked_body():
    out = replace_section(README, "results", "| a |\n|---|\n| 1 |\n")
    assert out == "# t\n\nintro\n\n<!-- xmr:results -->\n| a |\n|---|\n| 1 |\n<!-- /xmr:results -->\n\nafter\n"
    assert replace_section(out, "results", "old table") == README  # round trip


def test_missing_or_repeated_markers_are_errors():
    with pytest.raises(XmrError, match="section 'other': expected one .* found 0"):
        replace_section(README, "other", "x")
    with pytest.raises(XmrError, match="found 2"):
        replace_section(README + README, "results", "x")


def test_update_section_concatenates_parts_and_writes_out(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(README)
    (tmp_path / "a.md").write_text("table A\n")
    (tmp_path / "b.md").write_text("\ntable B\n\n")
    update_section(readme, "results", [tmp_path / "a.md", tmp_path / "b.md"], tmp_path / "section.md")
    assert "<!-- xmr:results -->\ntable A\n\ntable B\n<!-- /xmr:results -->" in readme.read_text()
    assert (tmp_path / "section.md").read_text() == "table A\n\ntable B\n"
    with pytest.raises(XmrError, match="missing.md: not found; build it first"):
        update_section(readme, "results", [tmp_path / "missing.md"])
    assert "table A" in readme.read_text()  # untouched after the failed call


def test_a_png_part_is_copied_next_to_the_page_and_linked_relative_to_it(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    page = docs / "results.md"
    page.write_text(README)
    (tmp_path / "t.md").write_text("table\n")
    png = tmp_path / "res" / "curves.png"
    png.parent.mkdir()
    png.write_bytes(b"\x89PNG fake bytes")
    update_section(page, "results", [tmp_path / "t.md", png], figure_dir=docs / "img")
    copied = docs / "img" / "results_curves.png"
    assert copied.read_bytes() == b"\x89PNG fake bytes"
    # the link is relative to the page (docs/results.md -> img/...), not to the working directory
    assert f"table\n\n![curves ({png})](img/results_curves.png)\n<!-- /xmr:results -->" in page.read_text()
