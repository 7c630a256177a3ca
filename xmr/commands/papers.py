"""``xmr papers``: the reproduction map of the five seed papers (xmr/report/paper_map.yaml; docs/papers.md)."""

from __future__ import annotations

import argparse

HELP = ("every table and figure of the seed papers: its targets, what they need, the paper's numbers and xmr's; "
        "writes docs/papers.md, checks the map against the papers' texts")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results-root", default="results", help="where xmr's results files are (default: results)")
    p.add_argument("--no-results", action="store_true",
                   help="leave xmr's numbers out (the page as the repository ships it, docs/papers.md)")
    p.add_argument("--markdown-out", metavar="PAGE.md", help="write the map as a Markdown page (docs/papers.md)")
    p.add_argument("--check-against", metavar="DIR",
                   help="check the map against the papers' texts DIR/{paper}.txt: every table and figure a text "
                        "names is in the map, and every item's recorded words are in the text")
    p.add_argument("--check-targets", action="store_true",
                   help="check that every recipe, ensemble, experiment and script the map names exists")
    p.add_argument("--map", metavar="MAP.yaml", help="another map file (default: xmr/report/paper_map.yaml)")
    p.add_argument("--config-dir", default="config")


def run(args: argparse.Namespace) -> int | None:
    import sys

    from xmr.report.papers import check_against, load_paper_map, render_markdown, target_problems, write_markdown

    doc = load_paper_map(args.map)
    results_root = None if args.no_results else args.results_root
    if args.check_against or args.check_targets:
        problems = (check_against(doc, args.check_against) if args.check_against else []) + \
            (target_problems(doc, args.config_dir) if args.check_targets else [])
        for line in problems:
            print(line, file=sys.stderr)
        items = sum(len(p["items"]) for p in doc["papers"])
        if problems:
            print(f"xmr papers: {len(problems)} problem(s) in the map of {items} tables and figures", file=sys.stderr)
            return 1
        print(f"the map's {items} tables and figures agree"
              + (f" with the texts in {args.check_against}" if args.check_against else "")
              + ("; every recipe, ensemble, experiment and script it names exists" if args.check_targets else ""))
        return None
    if args.markdown_out:
        out = write_markdown(doc, args.markdown_out, results_root)
        print(f"wrote {out}")
        return None
    print(render_markdown(doc, results_root), end="")
    return None
