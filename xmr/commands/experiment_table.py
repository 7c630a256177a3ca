"""xmr experiment-table: the table (Markdown, CSV) and figure of an experiment from its results files."""

HELP = "gather an experiment's results (config/experiments/NAME.yaml) into table.md, table.csv and figure.png"


def add_arguments(p):
    p.add_argument("--experiment", required=True, help="experiment name or file (config/experiments/NAME.yaml)")
    p.add_argument("--dataset", help="default: the experiment's first dataset")
    p.add_argument("--out-dir", help="default: results/DATASET/exp/NAME")
    p.add_argument("--results-root", default="results")
    p.add_argument("--runs-root", default="runs")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--strict", action="store_true", help="fail if any results file is missing")
    p.add_argument("--list-targets", action="store_true",
                   help="print the experiment's results files (one per line) and exit")


def run(args):
    from xmr.report.experiment_table import write_experiment_table
    from xmr.studies.experiments import load_experiment

    exp = load_experiment(args.experiment, args.config_dir)
    dataset = args.dataset or exp.datasets[0]
    exp.check_dataset(dataset)
    if args.list_targets:
        for _, _, path in exp.targets(dataset, args.results_root, args.config_dir):
            print(path)
        return
    out = write_experiment_table(exp, dataset, args.out_dir, args.results_root, args.runs_root, args.config_dir,
                                 allow_missing=not args.strict)
    note = f"; {len(out['missing'])} results files missing" if out["missing"] else ""
    print(f"wrote {out['table_md']}, {out['table_csv']}, {out['figure']} ({len(out['rows'])} rows{note})")
