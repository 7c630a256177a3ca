"""What the docs say is what a user gets: every command block and Python snippet of README.md and docs/**/*.md
(fenced, or indented by four spaces after a blank line) is collected and must be classified by a marker, an HTML
comment on the line(s) right before the block (blank lines between are allowed; Markdown renders nothing):

    <!-- docs-test: run -->                    executed here, in a workspace with the tiny synth data and a trained
                                               tiny DVSE run; optional arguments, written key="value":
                                               sub="OLD=>NEW; ..."  path substitutions ({run}: the tiny DVSE run
                                                   directory, {features}: tiny synth's feature folder, {py}: this
                                                   Python's bin folder), prelude="..." (Python run before a snippet),
                                               and the word slow (the test is marked slow)
    <!-- docs-test: dry-run -->                each line in its planning form, run from the repository root:
                                               `snakemake` gets -n --nolock, `make T` becomes `make -n T`, `dvc repro`/`dvc
                                               exp run` get --dry, `xmr doctor` runs as is, anything else gets --help
                                               appended (argparse still checks the options before it). It must exit
                                               0, or fail naming what is missing with no traceback. Optional: slow
    <!-- docs-test: needs WHAT: why -->        not runnable on a CPU clone (real COCO, a GPU, a cluster, a server);
                                               the reason is required
    <!-- docs-test: covered-by tests/X.py -->  a dedicated test runs these commands; the file must exist
    <!-- docs-test: text -->                   not a command: a file tree, a formula, a sample of output

Fenced blocks in ``yaml``, ``json``, ``text`` or ``console`` are text without a marker. A block without a marker
fails `test_every_block_is_classified`, naming the file, the line and the marker to add (docs/architecture.md,
"Documentation tests").

Python snippets run as doctests do: the snippet is executed (a fresh interpreter, the workspace as working
directory) and must not raise. Bash blocks run with ``bash -e``; ``# comments`` are kept (bash ignores them).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, xmr_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
TEXT_LANGS = {"yaml", "yml", "json", "text", "console", "csv"}
KINDS = ("run", "dry-run", "needs", "covered-by", "text")
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>run|dry-run|needs|covered-by|text)\b(?P<args>.*?)-->")
#: dedicated tests that another branch adds (name -> where it comes from); delete the entry once the file exists


@dataclass
class Block:
    doc: Path
    line: int  # 1-based line of the block's first line (the fence, or the first indented line)
    lang: str
    code: str
    kind: str | None
    args: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"

    def arg(self, name: str) -> str | None:
        m = re.search(rf'\b{name}="([^"]*)"', self.args)
        return m.group(1) if m else None

    @property
    def slow(self) -> bool:
        return re.search(r'(^|\s)slow(\s|$)', re.sub(r'\w+="[^"]*"', "", self.args)) is not None


def _marker_before(lines: list[str], i: int) -> tuple[str | None, str]:
    """The marker on the nearest non-blank line above line index ``i`` (None when that line is not a marker)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    m = MARKER.search(lines[j]) if j >= 0 else None
    return (m.group("kind"), m.group("args").strip()) if m else (None, "")


def collect(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    blocks, i, fence = [], 0, None
    while i < len(lines):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if m:
            fence, lang, start = m.group(1), m.group(2).lower(), i
            i += 1
            body = []
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            kind, args = _marker_before(lines, start)
            if kind is None and lang in TEXT_LANGS:
                kind = "text"
            blocks.append(Block(doc, start + 1, lang or "", "\n".join(body), kind, args))
            i += 1
            continue
        need = _code_indent(lines, i)
        if lines[i].strip() and (i == 0 or not lines[i - 1].strip()) and _indent(lines[i]) >= need:
            start, body = i, []
            while i < len(lines) and (_indent(lines[i]) >= need or not lines[i].strip()):
                body.append(lines[i])
                i += 1
            kind, args = _marker_before(lines, start)
            blocks.append(Block(doc, start + 1, "indented", textwrap.dedent("\n".join(body)).strip("\n"), kind, args))
            continue
        i += 1
    return blocks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _code_indent(lines: list[str], i: int) -> int:
    """The indentation that makes line ``i`` (after a blank line) an indented code block: 4, or 4 more than the
    content of the list item it follows (a paragraph indented less continues the item)."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    while j >= 0 and lines[j].strip():
        m = re.match(r"(\s*)([-*+]|\d+\.)\s+", lines[j])
        if m:
            return m.end() + 4
        if _indent(lines[j]) == 0:
            return 4
        j -= 1
    return 4


ALL = [b for d in DOCS for b in collect(d)]


def _ids(block) -> str:
    return block.where


def test_every_block_is_classified():
    missing = [f"{b.where}: {b.code.splitlines()[0][:60] if b.code else ''!r}" for b in ALL if b.kind is None]
    assert not missing, ("unclassified doc blocks (put <!-- docs-test: run | dry-run | needs WHAT: why | covered-by "
                         "tests/X.py | text --> on the line before each; tests/test_docs.py says what each does):\n"
                         + "\n".join(missing))
    for b in ALL:
        if b.kind == "needs":
            assert re.match(r"\S+.*:\s*\S", b.args), f"{b.where}: `needs WHAT: why` must give the reason"


@pytest.mark.parametrize("block", [b for b in ALL if b.kind == "covered-by"], ids=_ids)
def test_covered_by_names_a_test_file(block):
    path = block.args.split()[0]
    assert (REPO / path).is_file(), f"{block.where}: covered-by {path}: no such test file"


# ------------------------------------------------------------------------------------------------ dry-run blocks

def _logical_lines(code: str) -> list[str]:
    """The block's commands: continuation backslashes joined, comments and blank lines dropped."""
    text = code.replace("\\\n", " ")
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        out.append(ln)
    return out


def _strip_comment(line: str) -> str:
    lex = shlex.shlex(line, posix=True, punctuation_chars=False)
    lex.whitespace_split, lex.commenters = True, "#"
    return " ".join(shlex.quote(w) for w in lex)


def dry_form(line: str) -> str:
    words = shlex.split(_strip_comment(line))
    if not words:
        return ""
    exe = Path(words[0]).name
    if words[0].startswith(".venv/bin/"):
        words[0] = str(Path(sys.executable).parent / exe)
    if exe == "snakemake":
        return shlex.join([words[0], "-n", "--nolock", *words[1:]])  # beside a running workflow too
    if exe == "make":
        return shlex.join(["make", "-n", *words[1:]])
    if exe == "dvc" and (words[1:2] == ["repro"] or words[1:3] == ["exp", "run"]):
        return shlex.join([*words, "--dry"])
    if exe == "xmr" and words[1:2] == ["doctor"]:
        return shlex.join(words)
    if exe == "export":
        return shlex.join(words)
    return shlex.join([*words, "--help"])


def _dry_env() -> dict[str, str]:
    env = xmr_env()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if b.slow else [])
                                   for b in ALL if b.kind == "dry-run"], ids=_ids)
def test_dry_run_block_plans_or_names_what_is_missing(block):
    script = "\n".join(dry_form(ln) for ln in _logical_lines(block.code))
    r = subprocess.run(["bash", "-c", script + "\n"], cwd=REPO, env=_dry_env(),
                       capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "Exception" not in out, f"{block.where}:\n{script}\n{out[-3000:]}"
    if r.returncode != 0:  # allowed only as one line that names what is missing
        errs = [ln for ln in r.stderr.splitlines() if "rror" in ln]
        assert errs and len(errs) <= 2, f"{block.where}: exit {r.returncode}\n{script}\n{out[-3000:]}"


# ---------------------------------------------------------------------------------------------------- run blocks

@pytest.fixture(scope="module")
def workspace(module_tmp, tiny_synth, tiny_synth_run):
    """A working directory like a clone's after `make demo`, at toy size: config/ of the repo, runs/synth/dvse_demo is the
    tiny DVSE run."""
    ws = module_tmp("docs_ws")
    (ws / "config").symlink_to(REPO / "config")
    return ws


def _substituted(block: Block, tiny_synth, tiny_synth_run) -> str:
    code = block.code
    values = {"{run}": str(tiny_synth_run), "{features}": str(tiny_synth.features_dir / "synth"),
              "{py}": str(Path(sys.executable).parent)}
    for pair in filter(None, (p.strip() for p in (block.arg("sub") or "").split(";"))):
        old, new = pair.split("=>")
        for k, v in values.items():
            new = new.replace(k, v)
        assert old.strip() in code, f"{block.where}: sub {old.strip()!r} is not in the block"
        code = code.replace(old.strip(), new.strip())
    return code


@pytest.mark.parametrize("block", [pytest.param(b, marks=[pytest.mark.slow] if b.slow else [])
                                   for b in ALL if b.kind == "run"], ids=_ids)
def test_run_block(block, workspace, tiny_synth, tiny_synth_run):
    code = _substituted(block, tiny_synth, tiny_synth_run)
    if block.lang == "python":
        cmd = [sys.executable, "-c", (block.arg("prelude") or "") + "\n" + code]
    else:
        assert shutil.which("bash")
        cmd = ["bash", "-e", "-c", code]
    r = subprocess.run(cmd, cwd=workspace, env=_dry_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{block.where}:\n{code}\n{(r.stdout + r.stderr)[-3000:]}"
