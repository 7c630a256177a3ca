"""README.md reads in five minutes: at most 150 lines, no history (dates and commits live in the docs' dated tables),
every column of the demo's table defined beside the table, no term of the table (nor "seed method", "FR") used
before the sentence that defines it, and the headline verdicts it lists are those of the generated tables of
docs/results_synth.md."""

from __future__ import annotations

import re

import pytest

from conftest import REPO

README = (REPO / "README.md").read_text()
DEMO = "demo-synth"
#: how far below the demo table's end marker a column's definition may stand
AFTER_TABLE = 15
#: terms a reader meets in the README that it must define where it first uses them; the demo table's columns are added
TERMS = ["seed method", "FR"]
VERDICTS = ("holds", "refuted", "no effect ≥ Δ", "underpowered")


def generic(column: str) -> str:
    """A column named for one K (i2t R@5) is defined with the others as R@K."""
    return re.sub(r"R@\d+\b", "R@K", column)


def demo_section(text: str) -> tuple[int, int, list[str]]:
    """Line numbers (0-based) of the demo table's begin and end markers, and the table's column headers."""
    lines = text.splitlines()
    begin = lines.index(f"<!-- xmr:{DEMO} -->")
    end = lines.index(f"<!-- /xmr:{DEMO} -->")
    header = [c.strip() for c in lines[begin + 1].strip().strip("|").split("|")]
    return begin, end, header


def bold_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(1), m.end(1)) for m in re.finditer(r"\*\*(.+?)\*\*", text, flags=re.S)]


def undefined_columns(text: str) -> list[str]:
    """Demo columns with no bold definition (``**name**``; R@1/5/10 as ``R@K``) before the table or within
    :data:`AFTER_TABLE` lines after it."""
    begin, end, header = demo_section(text)
    lines = text.splitlines()
    missing = []
    for column in dict.fromkeys(generic(c) for c in header):
        at = [i for i, line in enumerate(lines) if f"**{column}**" in line]
        if not any(i < begin or end < i <= end + AFTER_TABLE for i in at):
            missing.append(column)
    return missing


def used_before_defined(text: str, terms: list[str]) -> list[str]:
    """Terms whose first use (outside the demo table and HTML comments) is not inside a bold span, the definition."""
    begin, end, header = demo_section(text)
    lines = text.splitlines()
    prose = "\n".join("" if begin <= i <= end else line for i, line in enumerate(lines))
    prose = re.sub(r"<!--.*?-->", lambda m: " " * len(m.group(0)), prose, flags=re.S)
    spans = bold_spans(prose)
    wrong = []
    # every column but the plain lowercase words (dataset, epochs): those are English before they are columns
    for term in dict.fromkeys(terms + [generic(c) for c in header if not (c.isalpha() and c.islower())]):
        m = re.search(rf"(?<![\w@]){re.escape(term)}(?:s|es)?(?![\w@])", prose)  # a plural is a use
        if m is None or not any(a <= m.start() and m.end() <= b for a, b in spans):
            wrong.append(f"{term!r} (line {prose[:m.start()].count(chr(10)) + 1})" if m else f"{term!r} (never used)")
    return wrong


OLD_README = """# xmr

- each seed method **proven to reduce to the base it extends**.

<!-- xmr:demo-synth -->
| dataset | target | protocol | i2t R@1 | i2t R@5 | RSUM | ended by | set corr. |
|---|---|---|---|---|---|---|---|
| synth | dvse_demo | plain | 17.0 | 41.5 | 192.3 | cap | 0.940 |
<!-- /xmr:demo-synth -->

Another CPU prints a few RSUM apart.

""" + "\n" * 100 + "**Training** (*set corr.* = mean off-diagonal cosine; **RSUM**: the sum of the recalls)\n"


def test_the_checks_catch_an_undefined_or_late_term():
    """What the README of 2026-12-06 did: columns explained 100 lines below the table, "seed method" never."""
    assert undefined_columns(OLD_README) == ["dataset", "target", "protocol", "i2t R@K", "RSUM", "ended by",
                                             "set corr."]
    assert used_before_defined(OLD_README, ["seed method"]) == [
        "'seed method' (line 3)", "'i2t R@K' (never used)", "'RSUM' (line 11)", "'ended by' (never used)",
        "'set corr.' (line 113)"]
    fixed = OLD_README.replace("each seed method", "each **seed method** (one of four)").replace(
        "<!-- xmr:demo-synth -->", "- **dataset**, **target**, **protocol**, **i2t R@K**: ...; **RSUM**: the sum; "
        "**ended by**: ...; **set corr.**: ...\n\n<!-- xmr:demo-synth -->")
    assert undefined_columns(fixed) == [] and used_before_defined(fixed, ["seed method"]) == []


def test_readme_is_short_and_defines_every_demo_column_where_it_is_used():
    assert len(README.splitlines()) <= 150
    assert undefined_columns(README) == []
    assert used_before_defined(README, TERMS) == []


def test_readme_holds_no_history():
    """Dates, commits and what changed are in the docs' dated tables (docs/benchmark.md "What changed",
    docs/speed.md), not in the README."""
    assert re.findall(r"\b20\d\d-\d\d-\d\d\b", README) == []
    commits = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", w) and re.search("[a-f]", w)]
    assert commits == []
    assert "What changed" not in README and "kernel pins" not in README


def verdicts_of_page(page: str) -> dict[str, str]:
    """claim -> verdict of every generated claims table of a docs page."""
    out, columns = {}, None
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[0] == "claim" and "verdict" in cells:
            columns = cells
        elif cells and columns and not set(cells[0]) <= {"-"} and len(cells) == len(columns):
            out[cells[0]] = cells[columns.index("verdict")].strip("*")
        elif not cells:
            columns = None
    return out


def test_readme_verdicts_are_those_of_the_results_page_scoped_to_synth():
    lines = README.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("<!-- readme-claims:"))
    page = REPO / re.search(r"readme-claims:\s*(\S+)", lines[at]).group(1)
    judged = verdicts_of_page(page.read_text())
    rows = []
    for line in lines[at + 3:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert len(rows) >= 6
    for paper, claim, verdict in rows:
        assert claim in judged, f"{claim!r} is not a claim of {page.name}"
        assert verdict == f"{judged[claim]} on synth", (claim, verdict, judged[claim])
        assert judged[claim] in VERDICTS


@pytest.mark.parametrize("page", ["docs/results_synth.md"])
def test_the_results_page_parses(page):
    judged = verdicts_of_page((REPO / page).read_text())
    assert judged["FR improves DVSE"] in VERDICTS and len(judged) >= 26
