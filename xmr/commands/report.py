"""xmr report: the results report of one or more datasets (HTML with embedded figures + Markdown + PNGs)."""

HELP = "write report.html (self-contained) and report.md (+ PNGs) from results/ and runs/ (config/report.yaml)"


def add_arguments(p):
    p.add_argument("--dataset", nargs="+", required=True, help="dataset(s), e.g. synth")
    p.add_argument("--out-dir", required=True, help="e.g. reports/synth")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--results-root", default="results")
    p.add_argument("--runs-root", default="runs")
    p.add_argument("--no-tracking", action="store_true", help="do not log the figures to MLflow")


def run(args):
    from xmr.report.build import write_report

    out = write_report(args.dataset, args.out_dir, args.config_dir, args.results_root, args.runs_root,
                       track=False if args.no_tracking else None)
    print(f"wrote {out['html']} and {out['md']} ({len(out['figures'])} figures, {len(out['notes'])} notes)")
    for line in out["notes"]:
        print(f"  note: {line}")
    for line in out["mlflow"]:
        print(f"  mlflow: {line}")
