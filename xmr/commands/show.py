"""xmr show: print results files as a table."""

HELP = "print one or more results JSON files as a Markdown table (R@1/5/10 both directions, RSUM)"


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results/{dataset}/{target}.json files")
    p.add_argument("--csv", action="store_true", help="CSV instead of Markdown")


def run(args):
    from xmr.report.tables import csv_table, markdown_table, result_rows

    rows = result_rows(args.results)
    print(csv_table(rows) if args.csv else markdown_table(rows), end="")
