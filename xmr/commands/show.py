"""xmr show: print results files as a table."""

HELP = ("print one or more results JSON files as a Markdown table (R@1/5/10 both directions, RSUM, how training "
        "ended, the test similarities' std and, for set methods, the sub-embeddings' correlation)")


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results/{dataset}/{target}.json files")
    p.add_argument("--csv", action="store_true", help="CSV instead of Markdown")
    p.add_argument("--out", help="also write the table to this file (e.g. the README's demo section)")


def run(args):
    from xmr.report.tables import csv_table, markdown_table, result_rows

    rows = result_rows(args.results)
    text = csv_table(rows) if args.csv else markdown_table(rows)
    print(text, end="")
    if args.out:
        from xmr.io import atomic_path

        with atomic_path(args.out, ".tmp") as tmp:
            tmp.write_text(text)
