"""The reproduction map (``xmr/report/paper_map.yaml``): every table and figure of the five seed papers, row by row,
with the targets that reproduce it, what they need, the numbers the paper prints (from ``paper_results.yaml``) and
xmr's own where a results file exists. ``xmr papers`` shows it and writes docs/papers.md.

The papers' texts are not in the repository. What the map records of each item (its id and the words its caption,
or its first mention, starts with) is checked against a paper's text by :func:`check_against`: every table or
figure id the text names must be in the map, and every item's words must be in the text.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from xmr.config.loader import safe_load
from xmr.core.errors import XmrError
from xmr.run.layout import RESULTS_ROOT, results_target_file

SRC = "xmr/report/paper_map.yaml"
STATUSES = ("target", "partial", "missing", "illustration", "elsewhere")
NEEDS = ("synth", "coco", "f30k", "cub", "butd", "bert", "gpu")
PAPER_KEYS = {"key", "title", "cite", "text", "items"}
ITEM_KEYS = {"id", "words", "source", "rows"}
ROW_KEYS = {"row", "targets", "needs", "status", "paper_experiment", "note"}
#: a table or figure the text names: "TABLE VI", "Table 5.5", "Table A.1-1", "Fig. 10", "Figure C-2", "Figure 5.1a"
ID_PATTERN = re.compile(r"\b(TABLE|Table|Fig\.|Figure)\s+(?:\*\*)?([A-Z]?[.-]?\d+(?:[.-]\d+)*|[IVX]+\b)")


def normal_id(kind: str, number: str) -> str:
    """``("Figure", "5.1")`` -> ``"Fig. 5.1"``, ``("TABLE", "VI")`` -> ``"Table VI"``."""
    return f"{'Table' if kind.lower() == 'table' else 'Fig.'} {number}"


def _check(doc: Any, src: str) -> dict:
    def fail(where: str, what: str) -> None:
        raise XmrError(f"{src}: {where}: {what}")

    if not isinstance(doc, dict) or not isinstance(doc.get("papers"), list):
        fail("papers", "expected a list of papers")
    for i, run in enumerate(doc.get("checked") or []):
        if not isinstance(run, dict) or set(run) != {"date", "commit", "machine", "result"}:
            fail(f"checked[{i}]", "expected the keys date, commit, machine, result")
    for i, paper in enumerate(doc["papers"]):
        where = f"papers[{i}]"
        if not isinstance(paper, dict) or set(paper) != PAPER_KEYS:
            fail(where, f"expected the keys {', '.join(sorted(PAPER_KEYS))}")
        seen = set()
        for j, item in enumerate(paper["items"]):
            iw = f"{paper['key']}: items[{j}]"
            if not isinstance(item, dict) or not {"id", "words", "rows"} <= set(item) or set(item) - ITEM_KEYS:
                fail(iw, f"expected the keys id, words, rows (and source)")
            if item["id"] in seen:
                fail(iw, f"{item['id']} is listed twice")
            seen.add(item["id"])
            if not item["rows"]:
                fail(iw, f"{item['id']}: give one row at least")
            for k, row in enumerate(item["rows"]):
                rw = f"{paper['key']} {item['id']}: rows[{k}]"
                if not isinstance(row, dict) or set(row) - ROW_KEYS or "row" not in row or "status" not in row:
                    fail(rw, f"expected the keys row, status (and {', '.join(sorted(ROW_KEYS - {'row', 'status'}))})")
                if row["status"] not in STATUSES:
                    fail(rw, f"status {row['status']!r}: choose one of {', '.join(STATUSES)}")
                if row["status"] in ("target", "partial") and not row.get("targets"):
                    fail(rw, f"status {row['status']}: name its targets")
                if row["status"] in ("missing", "illustration") and row.get("targets"):
                    fail(rw, f"status {row['status']} with targets: a row with a target is target or partial")
                if row["status"] in ("missing", "partial", "elsewhere") and not row.get("note"):
                    fail(rw, f"status {row['status']}: say in a note what is lacking")
                bad = sorted(set(row.get("needs") or []) - set(NEEDS))
                if bad:
                    fail(rw, f"needs {', '.join(bad)}: choose among {', '.join(NEEDS)}")
    return doc


@lru_cache(maxsize=4)
def _load(path: str | None) -> dict:
    if path is None:
        return _check(safe_load(resources.files("xmr.report").joinpath("paper_map.yaml").read_text()), SRC)
    if not Path(path).is_file():
        raise XmrError(f"{path}: reproduction map not found")
    return _check(safe_load(Path(path).read_text()), path)


def load_paper_map(path: str | os.PathLike | None = None) -> dict:
    """The validated map (the packaged file by default)."""
    return _load(None if path is None else str(path))


def map_targets(doc: dict) -> list[str]:
    """Every target the map names, in map order, once each."""
    return list(dict.fromkeys(t for p in doc["papers"] for it in p["items"] for r in it["rows"]
                              for t in r.get("targets") or []))


def target_problems(doc: dict, config_dir: str | os.PathLike = "config", root: str | os.PathLike = ".") -> list[str]:
    """What the map names that does not exist: a results target whose recipe or ensemble, experiment (on that
    dataset) or benchmark script is missing, a target of no known kind, a paper_experiment that
    ``paper_results.yaml`` lacks."""
    from xmr.report.paper import load_paper_results
    from xmr.run.layout import parse_target, split_experiment_table_target, split_results_target
    from xmr.studies.experiments import load_experiment

    problems = []
    for target in map_targets(doc):
        parts = split_results_target(target)
        try:
            if target.startswith("benchmarks/"):
                if not (Path(root) / target).is_file():
                    problems.append(f"{target}: no such script")
            elif target.startswith("reports/") or "/fr_grid/" in target:
                if not (Path(config_dir) / "datasets" / f"{target.split('/')[1]}.yaml").is_file():
                    problems.append(f"{target}: no dataset {target.split('/')[1]!r}")
            elif split_experiment_table_target(target):
                dataset, name = split_experiment_table_target(target)
                load_experiment(name, config_dir).check_dataset(dataset)
            elif parts and "/" not in parts[1]:
                parse_target(*parts, config_dir)
            else:
                problems.append(f"{target}: not a target the map knows (results/, reports/, benchmarks/)")
        except XmrError as e:
            problems.append(f"{target}: {e}")
    experiments = load_paper_results().get("experiments") or {}
    for p in doc["papers"]:
        for it in p["items"]:
            for r in it["rows"]:
                if r.get("paper_experiment") and r["paper_experiment"] not in experiments:
                    problems.append(f"{p['key']} {it['id']}: paper_experiment {r['paper_experiment']!r} is not in "
                                    f"xmr/report/paper_results.yaml experiments")
    return problems


def _normal_text(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("*", "")).casefold()


def text_ids(text: str) -> list[str]:
    """The table and figure ids a paper's text names, in order of first mention."""
    return list(dict.fromkeys(normal_id(m.group(1), m.group(2)) for m in ID_PATTERN.finditer(text)))


def check_against(doc: dict, texts_dir: str | os.PathLike) -> list[str]:
    """The map against the papers' texts (``texts_dir/{paper text}``): every id a text names must be an item of
    its paper, and every item's words must be in the text. Returns the problems (empty: they agree)."""
    problems = []
    for paper in doc["papers"]:
        path = Path(texts_dir) / paper["text"]
        if not path.is_file():
            problems.append(f"{path}: not found (the text of {paper['title']})")
            continue
        text = path.read_text(errors="replace")
        listed = {it["id"] for it in paper["items"]}
        for tid in text_ids(text):
            if tid not in listed:
                problems.append(f"{path.name} names {tid}, which the map's {paper['key']} items lack")
        norm = _normal_text(text)
        for it in paper["items"]:
            if _normal_text(it["words"]) not in norm:
                problems.append(f"{path.name}: {it['id']}: the words {it['words']!r} are not in the text")
    return problems


# --- the page --------------------------------------------------------------------------------------------------

def _plain_source(source: str) -> str:
    return re.sub(r"\s*\([^)]*\.md[^)]*\)", "", source).strip()


def _entries_for(item: dict, target: str, entries: list[dict]) -> list[dict]:
    from xmr.run.layout import split_results_target

    parts = split_results_target(target)
    if not item.get("source") or not parts or "/" in parts[1]:
        return []
    dataset, name = parts
    out = []
    for e in entries:
        # "DVSE Table I" names that table, not "DVSE Table II"; a source may name two papers ("...; DivE Table 2")
        if e["dataset"] != dataset or not re.search(rf"(^|; ){re.escape(item['source'])}(?![\w.])",
                                                    _plain_source(e["source"])):
            continue
        if name == (e["recipe"] if e["rerank"] == "none" else f"{e['recipe']}_{e['rerank']}"):
            out.append(e)
    return out


def _number(e: dict) -> str:
    if e.get("rsum") is not None:
        return f"{e['protocol']} {e['rsum']:.1f}"
    r1 = "/".join("—" if e[d][0] is None else f"{e[d][0]:.1f}" for d in ("i2t", "t2i"))
    return f"{e['protocol']} R@1 {r1}"


def _xmr_number(target: str, results_root: Path | None) -> str | None:
    """xmr's RSUM of a results target (each protocol), or ``done`` for a table; None when not made yet (or
    ``results_root`` None)."""
    path = results_target_file(target, results_root) if results_root is not None else None
    if path is None or not path.is_file():
        return None
    if path.suffix != ".json":
        return "done"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    protocols = doc.get("protocols") or {doc.get("protocol", "?"): doc}
    return ", ".join(f"{p} {m['rsum']:.1f}" for p, m in protocols.items() if m.get("rsum") is not None) or None


def map_rows(doc: dict, results_root: str | os.PathLike | None = RESULTS_ROOT) -> list[dict[str, Any]]:
    """One dict per map row: paper, item, row, targets, needs, status, printed (the paper's numbers), xmr (from
    the results files under ``results_root``; None: none), note."""
    from xmr.report.paper import load_paper_results

    printed = load_paper_results()
    entries, experiments = printed["entries"], printed.get("experiments") or {}
    rows = []
    for paper in doc["papers"]:
        for it in paper["items"]:
            for r in it["rows"]:
                targets = r.get("targets") or []
                nums = []
                for t in targets:
                    for e in _entries_for(it, t, entries):
                        nums.append(f"{Path(t).stem} {_number(e)}")
                if r.get("paper_experiment"):
                    exp = experiments[r["paper_experiment"]]
                    nums.append(f"RSUM of {len(exp['rsum'])} variants ({exp['dataset']})")
                root = None if results_root is None else Path(results_root)
                mine = [f"{Path(t).stem if t.endswith('.json') else t.split('/')[-2]} {n}"
                        for t in targets if (n := _xmr_number(t, root))]
                rows.append({"paper": paper["key"], "item": it["id"], "row": r["row"], "targets": targets,
                             "needs": r.get("needs") or [], "status": r["status"], "printed": nums, "xmr": mine,
                             "note": r.get("note", "")})
    return rows


def _cell(values: Iterable[str], code: bool = False) -> str:
    values = [f"`{v}`" if code else v for v in values]
    return "<br>".join(values) if values else "—"


def render_markdown(doc: dict, results_root: str | os.PathLike | None = RESULTS_ROOT) -> str:
    """docs/papers.md: a summary per paper, then every item's rows."""
    rows = map_rows(doc, results_root)
    out = ["# Reproducing the papers, table by table", "",
           "<!-- generated by `xmr papers --no-results --markdown-out docs/papers.md` from xmr/report/paper_map.yaml; "
           "do not edit by hand -->", "",
           "Every table and figure of the five papers xmr implements, row by row: the targets that reproduce it "
           "(`snakemake -c2 TARGET`), what they need, and what xmr lacks. The numbers the papers print come from "
           "`xmr/report/paper_results.yaml`. `xmr papers` prints this page with xmr's own RSUM beside them "
           "wherever a results file exists in your checkout; this copy is generated without results.", "",
           "Needs: `synth` the embedded synthetic data (a CPU is enough); `coco`, `f30k`, `cub` the dataset "
           "(docs/datasets.md); `butd` the BUTD detector's region features (detectron2, or SCAN's precomputed "
           "features); `bert` a local BERT copy; `gpu` hours of training on a GPU. Status: **target** the targets "
           "reproduce it; **partial** they reproduce part of it (the note says which); **missing** no target yet; "
           "**illustration** a diagram; **elsewhere** in another document than the one xmr follows.", "",
           "How the list is checked: the map records each item's id and the words its caption (or, where the "
           "text prints none, its first mention) starts with. `xmr papers --check-against DIR` reads the papers' "
           "texts from DIR (not part of the repository) and fails when a text names a table or figure the map "
           "lacks, or lacks the words the map records; tests/test_paper_map.py runs it on a small sample text, "
           "plans every target with one `snakemake -n`, and checks that every recipe, ensemble, experiment and "
           "script the map names exists.", "",
           "| checked against the papers' texts on | commit | machine | result |", "|---|---|---|---|",
           *(f"| {c['date']} | {c['commit']} | {c['machine']} | {c['result']} |" for c in doc.get("checked") or []),
           "",
           "| paper | items | rows | target | partial | missing |", "|---|---|---|---|---|---|"]
    for paper in doc["papers"]:
        mine = [r for r in rows if r["paper"] == paper["key"]]
        count = {s: sum(r["status"] == s for r in mine) for s in STATUSES}
        out.append(f"| {paper['title']} | {len(paper['items'])} | {len(mine)} | {count['target']} | "
                   f"{count['partial']} | {count['missing']} |")
    for paper in doc["papers"]:
        out += ["", f"## {paper['title']}", "", f"{paper['cite']}.", "",
                "| item | row | targets | needs | status | paper prints | xmr | note |",
                "|---|---|---|---|---|---|---|---|"]
        for r in (r for r in rows if r["paper"] == paper["key"]):
            out.append(f"| {r['item']} | {r['row']} | {_cell(r['targets'], code=True)} | "
                       f"{', '.join(r['needs']) or '—'} | {r['status']} | {_cell(r['printed'])} | "
                       f"{_cell(r['xmr'])} | {r['note'] or ''} |")
    return "\n".join(out) + "\n"


def write_markdown(doc: dict, out: str | os.PathLike, results_root: str | os.PathLike | None = RESULTS_ROOT) -> Path:
    from xmr.core.io import atomic_path

    with atomic_path(out, ".md") as tmp:
        tmp.write_text(render_markdown(doc, results_root))
    return Path(out)


__all__ = ["load_paper_map", "map_targets", "target_problems", "text_ids", "check_against", "map_rows",
           "render_markdown", "write_markdown"]
