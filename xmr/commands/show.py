"""xmr show: print results files as a table."""

import json

HELP = ("print one or more results JSON files as a Markdown table (R@1/5/10 both directions, RSUM, how training "
        "ended, the test similarities' std and, for set methods, the sub-embeddings' correlation)")


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results/{dataset}/{target}.json files")
    p.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    p.add_argument("--out", help="also write the table to this file (e.g. the README's demo section)")


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
        except IsADirectoryError:
            raise XmrError(f"{p}: is a directory; {hint}") from None
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise XmrError(f"{p}: not a JSON file; {hint}") from None
        if not isinstance(doc, dict) or "protocol" not in doc or not isinstance(doc.get("i2t"), dict):
            what = "a run's train.json" if isinstance(doc, dict) and "best_epoch" in doc else "not a results file"
            raise XmrError(f"{p}: {what} (no retrieval metrics); {hint}")


def run(args):
    from xmr.report.tables import csv_table, markdown_table, result_rows

    check_results_files(args.results)
    rows = result_rows(args.results)
    text = csv_table(rows) if args.csv else markdown_table(rows)
    print(text, end="")
    if args.out:
        from xmr.io import atomic_path

        with atomic_path(args.out, ".tmp") as tmp:
            tmp.write_text(text)
