"""Generated sections of README.md: tables the workflow produced, pasted between marker comments so that the
README's numbers are never typed by hand.

A section is ``<!-- xmr:NAME -->`` ... ``<!-- /xmr:NAME -->``; :func:`update_section` replaces what lies between
the markers (the markers stay) and writes the file atomically. A part that is a PNG is copied into the figure folder
(committed with the page, since results/ is not) and shown as an image.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from xmr.core.errors import XmrError
from xmr.core.io import atomic_path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- xmr:{name} -->", f"<!-- /xmr:{name} -->"


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the body of section ``name`` replaced by ``body``; an error when the markers are missing
    or appear more than once."""
    begin, end = markers(name)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), flags=re.S)
    found = pattern.findall(text)
    if len(found) != 1:
        raise XmrError(f"section {name!r}: expected one '{begin}' ... '{end}' pair, found {len(found)}; add the "
                       f"two marker lines where the generated text belongs")
    return pattern.sub(lambda _: f"{begin}\n{body.rstrip()}\n{end}", text)


def read_section(readme: str | os.PathLike, name: str) -> str:
    """The body between section ``name``'s markers in ``readme`` (one line naming the file when it has none)."""
    begin, end = markers(name)
    text = Path(readme).read_text()
    found = re.findall(re.escape(begin) + r"\n(.*?)" + re.escape(end), text, flags=re.S)
    if len(found) != 1:
        raise XmrError(f"{readme}: expected one section {name!r} ('{begin}' ... '{end}'), found {len(found)}")
    return found[0]


def table_rsums(body: str, source: str = "table") -> dict[tuple[str, str], float]:
    """``{(dataset, target): RSUM}`` of a Markdown table with ``dataset``, ``target`` and ``RSUM`` columns."""
    lines = [ln.strip() for ln in body.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2:
        raise XmrError(f"{source}: no Markdown table")
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    missing = [c for c in ("dataset", "target", "RSUM") if c not in head]
    if missing:
        raise XmrError(f"{source}: the table has no column {', '.join(missing)}")
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(head, cells))
        out[(row["dataset"], row["target"])] = float(row["RSUM"])
    return out


def check_rsums(rows: list[dict], expected: dict[tuple[str, str], float], tolerance: float,
                source: str) -> str:
    """One line saying how far each row's RSUM is from ``expected``'s (within ``tolerance``); an error naming the
    first row that is further, or that ``expected`` lacks."""
    parts = []
    for r in rows:
        key = (r["dataset"], r["target"])
        if key not in expected:
            raise XmrError(f"{source}: no row for {key[0]} / {key[1]} to compare with; regenerate it")
        gap = float(r["RSUM"]) - expected[key]
        if abs(gap) > tolerance:
            raise XmrError(f"{key[1]}: RSUM {r['RSUM']:.1f} is {gap:+.1f} from {source}'s {expected[key]:.1f}, "
                           f"beyond the ±{tolerance:g} that CPUs differ by; the table is stale or this run went wrong")
        parts.append(f"{key[1]} {r['RSUM']:.1f} ({gap:+.1f})")
    return f"RSUM within ±{tolerance:g} of {source}: " + ", ".join(parts)


def figure_name(section: str, png: str | os.PathLike) -> str:
    """File name of a section's copied figure: the section, then the source's name (``results-synth_benchmark.png``)."""
    return f"{section}_{Path(png).name}"


def update_section(readme: str | os.PathLike, name: str, parts: list[str | os.PathLike],
                   out: str | os.PathLike | None = None, figure_dir: str | os.PathLike = "docs/img") -> str:
    """Concatenate the Markdown files ``parts`` (blank line between them), put them into section ``name`` of
    ``readme``; also write the section's text to ``out`` when given (the Snakemake rule's output). A ``.png`` part
    is copied to ``figure_dir`` as :func:`figure_name` and linked relative to ``readme``."""
    import shutil

    readme = Path(readme)
    if not readme.exists():
        raise XmrError(f"{readme}: not found")
    for p in map(Path, parts):
        if not p.exists():
            raise XmrError(f"{p}: not found; build it first (e.g. snakemake -c2 {p})")
    texts = []
    for p in map(Path, parts):
        if p.suffix.lower() == ".png":
            dest = Path(figure_dir) / figure_name(name, p)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(dest, ".png") as tmp:
                shutil.copyfile(p, tmp)
            link = os.path.relpath(dest.resolve(), readme.resolve().parent)
            texts.append(f"![{p.stem} ({p})]({Path(link).as_posix()})")
        else:
            texts.append(p.read_text().strip())
    body = "\n\n".join(texts)
    import fcntl

    # two sections written by parallel jobs (snakemake -c2): read-modify-write one at a time
    with open(readme.with_name(f".{readme.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        new = replace_section(readme.read_text(), name, body)
        with atomic_path(readme, ".md") as tmp:
            tmp.write_text(new)
    if out is not None:
        with atomic_path(out, ".md") as tmp:
            tmp.write_text(body + "\n")
    return body
