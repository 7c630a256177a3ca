"""xmr show: print results files as a table."""

import json
import sys

HELP = ("print one or more results JSON files as a Markdown table (R@1/5/10 both directions, RSUM, how training "
        "ended, the test similarities' std and, for set methods, the sub-embeddings' correlation), or a run's epochs")


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results files (results/{dataset}/{target}.json and their "
                   ".metrics.json; what xmr evaluate and xmr test write, a --reranks file one row per re-ranker), "
                   "folders (every results file in them, e.g. results/synth/), run directories "
                   "(runs/{dataset}/{recipe}/, or their train.json: how training went, epoch by epoch), or folders "
                   "of runs (runs/synth/, runs/: one row per run)")
    p.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    p.add_argument("--set-statistics", action="store_true",
                   help="the results files' set statistics instead of their metrics: K, the sub-embeddings' mean "
                        "cosine (DVSE Fig. 6) and circular variance (DivE Table 3 right), of images, captions, residuals")
    p.add_argument("--name-by", choices=["target", "file"], default="target",
                   help="name each row by its run's recipe (default) or by its results file's name: several "
                        "evaluations of one run, such as DivE Table 5's rows (results/DATASET/elements/RUN/*.json)")
    p.add_argument("--out", help="also write the table to this file (e.g. the README's demo section)")
    p.add_argument("--expect", metavar="FILE#SECTION",
                   help="compare each row's RSUM with the table of a generated section of FILE (README.md#demo-synth, "
                        "what `make demo` checks); a row further than --rsum-tolerance is an error")
    p.add_argument("--rsum-tolerance", type=float, default=8.0,
                   help="with --expect: how far an RSUM may be (default 8: the widest gap between the demo's tables "
                        "under CPU kernel pins, docs/speed.md \"The table on another CPU\")")


#: the files that make a folder a run directory, the first written from a training's first step (xmr.run.progress)
RUN_FILES = ("train.json", "history.csv", "progress.json")


def _is_results_file(path) -> bool:
    """A full results file (:func:`xmr.report.tables.results_kind`: one evaluation, or one per re-ranker)."""
    from xmr.report.tables import results_kind

    try:
        return results_kind(json.loads(path.read_bytes().decode("utf-8"))) in ("results", "by_rerank")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def expand_folders(paths: list[str]) -> list[str]:
    """A folder stands for the results files in it (sorted by name; ``--reranks`` files too, but not DVC's
    ``*.metrics.json``, which repeat their full file's numbers, nor its other JSON files). Named files are read as
    they are (:func:`xmr.report.tables.results_in`: one line for a file that holds no results)."""
    from pathlib import Path

    from xmr.core.errors import XmrError

    out = []
    for p in paths:
        if not Path(p).is_dir():
            out.append(p)
            continue
        found = [str(f) for f in sorted(Path(p).glob("*.json")) if _is_results_file(f)]
        if not found:
            raise XmrError(f"{p}: no results files in this folder, nor runs (results/{{dataset}}/"
                           f"{{target}}.json are made by `snakemake results/DATASET/TARGET.json`, xmr evaluate or "
                           f"xmr test; runs/{{dataset}}/{{recipe}}/ by xmr train)")
        out += found
    return out


def _is_run(path: str) -> bool:
    """A run's ``train.json``, or a folder that holds one (or, while it trains, ``history.csv`` or, from its first
    step, ``progress.json``) and no results files (a run directory)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_dir():
        return p.name == "train.json" and p.is_file()
    return any((p / name).is_file() for name in RUN_FILES) and not any(_is_results_file(f) for f in p.glob("*.json"))


def runs_below(path: str) -> list[str]:
    """The run directories anywhere below a folder that holds no results files itself (``runs/synth/``: recipes,
    ``exp/{experiment}/{variant}``, ``bench/{benchmark}/{variant}/s{seed}``), by path; empty for anything else."""
    from pathlib import Path

    p = Path(path)
    if not p.is_dir() or _is_run(path) or any(_is_results_file(f) for f in p.glob("*.json")):
        return []
    found = {f.parent for name in RUN_FILES for f in p.rglob(name)}
    return [str(d) for d in sorted(found) if _is_run(str(d))]


def _set_statistics(args, table) -> None:
    """``--set-statistics``: one row per results file (DVSE Fig. 6's correlation, DivE's circular variance)."""
    from xmr.core.io import atomic_path
    from xmr.report.tables import SET_COLUMNS, set_statistics_rows

    text = table(set_statistics_rows(expand_folders(args.results)), SET_COLUMNS)
    print(text, end="")
    if args.out:
        with atomic_path(args.out, ".tmp") as tmp:
            tmp.write_text(text)


def run(args):
    from xmr.report.tables import (HISTORY_COLUMNS, RUNS_COLUMNS, csv_table, markdown_table, result_rows, run_history,
                                   run_row, saturation_notes)

    table = csv_table if args.csv else markdown_table
    if args.set_statistics:
        return _set_statistics(args, table)
    runs = [p for p in args.results if _is_run(p)]
    folders = {p: runs_below(p) for p in args.results if p not in runs}
    folders = {p: below for p, below in folders.items() if below}
    results = [p for p in args.results if p not in runs and p not in folders]
    rows = result_rows(expand_folders(results), name_by=args.name_by) if results else []
    parts = [table(rows)] if results else []
    for r in runs:
        line, rows = run_history(r)
        parts.append(f"{line}\n\n{table(rows, HISTORY_COLUMNS)}")
    for below in folders.values():
        parts.append(table([run_row(r) for r in below], RUNS_COLUMNS))
    text = "\n".join(parts)
    print(text, end="")
    if notes := saturation_notes(rows):  # under the table; beside a CSV, on stderr
        print(notes, file=sys.stderr if args.csv else sys.stdout)
    if args.expect:
        from xmr.core.errors import XmrError
        from xmr.report.readme import check_rsums, read_section, table_rsums

        readme, _, section = args.expect.partition("#")
        if not section or not results:
            raise XmrError(f"--expect {args.expect}: give FILE#SECTION (README.md#demo-synth) and results files")
        expected = table_rsums(read_section(readme, section), f"{readme}#{section}")
        print(check_rsums(result_rows(expand_folders(results), name_by=args.name_by), expected, args.rsum_tolerance,
                          f"{readme}#{section}"))
    if args.out:
        from xmr.core.io import atomic_path

        with atomic_path(args.out, ".tmp") as tmp:
            tmp.write_text(text)
