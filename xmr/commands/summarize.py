"""xmr summarize: gather results files into summary.{json,md,csv} (DVC metrics, README tables)."""

HELP = "gather results JSON files into summary.json/.md/.csv in an output folder"


def add_arguments(p):
    p.add_argument("results", nargs="+", help="results/{dataset}/{target}.json files")
    p.add_argument("--out-dir", required=True)


def run(args):
    from xmr.report.tables import write_summary

    metrics = write_summary(args.results, args.out_dir)
    print(f"wrote {args.out_dir}/summary.{{json,md,csv}} ({len(metrics)} targets)")
