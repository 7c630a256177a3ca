"""The project speaks of itself only: README.md, docs/, the package, the tests, the benchmarks, the configs and the
workflow name machines by what they are and measurements by date and commit, never by how xmr was developed
(session numbers, issue numbers, machines that were "lent", "leases", "device time"); and no file points at a path
outside the repository (a Markdown link that leaves it, an absolute path into the development machine, the
material the project was built from). Papers are cited by title, venue and arXiv id, released code by its URL."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO

ROOTS = ["README.md", "docs", "xmr", "tests", "benchmarks", "config", "workflow", "Snakefile", "Makefile", "dvc.yaml"]
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".smk", ".sh", ".txt", ".toml", ""}
THIS = Path(__file__).resolve()

# the words, assembled so that this file does not match itself
_S, _L, _D = "sess" + "ion", "le" + "nt", "dev" + "ice time"
_UP = "../" + "shared"  # in two parts, as above: this file must not hold the path it forbids
WORDS = {
    "a session number": rf"\b{_S}s? \d",
    "a machine that was lent": rf"\b{_L}\b",
    "a lease": r"\blease[sd]?\b",
    "device time": rf"\b{_D}\b",
    "the device tool's output folder": r"\$OUT\b",
    "an issue number": r"\bissues? #?\d+",
    "something carried to a machine": r"\bcarried\b(?! out)",
}
OUTSIDE = {
    "a path to the development material": r"\.\./shared\b|\bshared/(seeds|methods|notes|hooks)\b",
    "an absolute path into the development machine": r"/work/(main|shared|bench)\b",
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def project_files() -> list[Path]:
    out = []
    for root in ROOTS:
        path = REPO / root
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out += [f for f in files if f.suffix in SUFFIXES and "__pycache__" not in f.parts and f.resolve() != THIS]
    return out


def findings(text: str, patterns: dict[str, str]) -> list[str]:
    return [f"line {text[:m.start()].count(chr(10)) + 1}: {what} ({m.group(0)!r})"
            for what, pattern in patterns.items() for m in re.finditer(pattern, text, flags=re.I)]


def test_the_words_and_paths_are_searched_for():
    """The patterns catch what they are meant to, and leave ordinary English alone."""
    assert findings(f"measured in {_S} 22 on the {_L} GPU machine", WORDS) == [
        f"line 1: a session number ('{_S} 2')", f"line 1: a machine that was lent ('{_L}')"]
    assert findings("see Issue 33's VM; the next lease; $OUT/x; 15 min of " + _D, WORDS) == [
        "line 1: a lease ('lease')", f"line 1: device time ('{_D}')", "line 1: the device tool's output folder ('$OUT')",
        "line 1: an issue number ('Issue 33')"]
    assert findings("the study was carried out; the sessions of a user; lentil; a silent release", WORDS) == []
    assert findings(f"({_UP}/methods/dvse.md)\n/work/main/x", OUTSIDE) == [
        f"line 1: a path to the development material ('{_UP}')",
        "line 2: an absolute path into the development machine ('/work/main')"]


def test_the_project_speaks_of_itself_only():
    found = []
    for path in project_files():
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(REPO)}: {f}" for f in findings(text, WORDS) + findings(text, OUTSIDE)]
    assert found == [], "\n".join(found)


def test_markdown_links_stay_in_the_repository():
    """A relative link of a Markdown file names a file or folder of the repository that exists."""
    bad = []
    for path in (p for p in project_files() if p.suffix == ".md"):
        for m in LINK.finditer(path.read_text()):
            target = m.group(1).split("#")[0]
            if not target or re.match(r"^[a-z]+:", target):  # an anchor in the page, a URL
                continue
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                bad.append(f"{path.relative_to(REPO)}: {target}")
    assert bad == [], "links that leave the repository or lead nowhere:\n" + "\n".join(bad)
