"""xmr mlflow-table: the results table rebuilt from MLflow alone (no results/ files needed)."""

HELP = "print the results table of an MLflow experiment (e.g. xmr/synth) from its runs' test metrics"


def add_arguments(p):
    p.add_argument("--experiment", required=True, help="experiment name, e.g. xmr/synth (one per dataset)")
    p.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    p.add_argument("--format", choices=["md", "csv", "json"], default="md")
    p.add_argument("--protocol", default=None, help="only this evaluation protocol (e.g. coco1k)")
    p.add_argument("--all-runs", action="store_true",
                   help="every run, not only the newest run of each recipe")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")


def run(args):
    import json

    from xmr.core.errors import XmrError
    from xmr.report.tables import COLUMNS, csv_table, markdown_table
    from xmr.run.tracking import results_table

    rows = results_table(args.experiment, uri=args.tracking_uri, all_runs=args.all_runs)
    if args.protocol:
        rows = [r for r in rows if r["protocol"] == args.protocol]
    if not rows:
        raise XmrError(f"MLflow experiment {args.experiment!r}: no run has test metrics"
                       f"{' for protocol ' + args.protocol if args.protocol else ''}; "
                       f"evaluate one first (`xmr test`, or snakemake results/...json)")
    columns = COLUMNS + ["run_name", "run_id"]
    if args.format == "json":
        text = json.dumps(rows, indent=2) + "\n"
    elif args.format == "csv":
        text = csv_table(rows, columns)
    else:
        text = markdown_table(rows, columns)
    if args.out:
        from pathlib import Path

        Path(args.out).write_text(text)
    else:
        print(text, end="")
