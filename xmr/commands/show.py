"""xmr show: print results files as a table."""

import json

HELP = ("print one or more results JSON files as a Markdown table (R@1/5/10 both directions, RSUM, how training "
        "ended, the test similarities' std and, for set methods, the sub-embeddings' correlation), or a run's epochs")


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results/{dataset}/{target}.json files, folders (every results "
                   "file in them, e.g. results/synth/), run directories (runs/{dataset}/{recipe}/, or their "
                   "train.json: how training went, epoch by epoch), or folders of runs (runs/synth/, runs/: one "
                   "row per run)")
    p.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    p.add_argument("--out", help="also write the table to this file (e.g. the README's demo section)")


def _is_results(doc) -> bool:
    """What ``xmr evaluate``/``xmr test`` write: a protocol and the retrieval metrics."""
    return isinstance(doc, dict) and "protocol" in doc and isinstance(doc.get("i2t"), dict)


def _is_results_file(path) -> bool:
    try:
        return _is_results(json.loads(path.read_bytes().decode("utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def expand_folders(paths: list[str]) -> list[str]:
    """A folder stands for the results files in it (sorted by name; its other JSON files, such as DVC's
    ``*.metrics.json``, are left out). Named files are checked (:func:`check_results_files`); a folder's already
    were, by the filter."""
    from pathlib import Path

    from xmr.errors import XmrError

    out = []
    for p in paths:
        if not Path(p).is_dir():
            check_results_files([p])
            out.append(p)
            continue
        found = [str(f) for f in sorted(Path(p).glob("*.json")) if _is_results_file(f)]
        if not found:
            raise XmrError(f"{p}: no results files in this folder, nor runs (results/{{dataset}}/"
                           f"{{target}}.json are made by `snakemake results/DATASET/TARGET.json`, xmr evaluate or "
                           f"xmr test; runs/{{dataset}}/{{recipe}}/ by xmr train)")
        out += found
    return out


def check_results_files(paths: list[str]) -> None:
    """One line, not a traceback, for a file that is not a results JSON (a train.json, a .npy, a config): what
    ``xmr show`` reads are the files of ``xmr evaluate``/``xmr test`` and the workflow's results/{dataset}/*.json."""
    from xmr.errors import XmrError

    hint = "xmr show reads results files (results/{dataset}/{target}.json, or the --out of xmr evaluate / xmr test)"
    for p in paths:
        try:
            with open(p, "rb") as f:
                doc = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            raise XmrError(f"{p}: file not found") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise XmrError(f"{p}: not a JSON file; {hint}") from None
        if not _is_results(doc):
            what = "a run's train.json" if isinstance(doc, dict) and "best_epoch" in doc else "not a results file"
            raise XmrError(f"{p}: {what} (no retrieval metrics); {hint}")


def _is_run(path: str) -> bool:
    """A run's ``train.json``, or a folder that holds one (or, while it trains, ``history.csv``) and no results
    files (a run directory)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_dir():
        return p.name == "train.json" and p.is_file()
    return ((p / "train.json").is_file() or (p / "history.csv").is_file()) \
        and not any(_is_results_file(f) for f in p.glob("*.json"))


def runs_below(path: str) -> list[str]:
    """The run directories anywhere below a folder that holds no results files itself (``runs/synth/``: recipes,
    ``exp/{experiment}/{variant}``, ``bench/{benchmark}/{variant}/s{seed}``), by path; empty for anything else."""
    from pathlib import Path

    p = Path(path)
    if not p.is_dir() or _is_run(path) or any(_is_results_file(f) for f in p.glob("*.json")):
        return []
    found = {f.parent for name in ("train.json", "history.csv") for f in p.rglob(name)}
    return [str(d) for d in sorted(found) if _is_run(str(d))]


def run(args):
    from xmr.report.tables import (HISTORY_COLUMNS, RUNS_COLUMNS, csv_table, markdown_table, result_rows, run_history,
                                   run_row)

    table = csv_table if args.csv else markdown_table
    runs = [p for p in args.results if _is_run(p)]
    folders = {p: runs_below(p) for p in args.results if p not in runs}
    folders = {p: below for p, below in folders.items() if below}
    results = [p for p in args.results if p not in runs and p not in folders]
    parts = [table(result_rows(expand_folders(results)))] if results else []
    for r in runs:
        line, rows = run_history(r)
        parts.append(f"{line}\n\n{table(rows, HISTORY_COLUMNS)}")
    for below in folders.values():
        parts.append(table([run_row(r) for r in below], RUNS_COLUMNS))
    text = "\n".join(parts)
    print(text, end="")
    if args.out:
        from xmr.io import atomic_path

        with atomic_path(args.out, ".tmp") as tmp:
            tmp.write_text(text)
