"""xmr benchmark-table: mean ± std tables, figure and claims table of a seeded benchmark from its results."""

HELP = ("gather a seeded benchmark's results (config/benchmark/NAME.yaml) into NAME.md/.csv/.json/.png and the "
        "claims table NAME_claims.md/.csv")


def add_arguments(p):
    p.add_argument("--benchmark", default="benchmark", help="benchmark name or file (config/benchmark/NAME.yaml)")
    p.add_argument("--out-dir", help="default: results/DATASET")
    p.add_argument("--results-root", default="results")
    p.add_argument("--runs-root", default="runs")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--allow-missing", action="store_true",
                   help="write the tables from the runs that have results; list the missing ones and mark their claims "
                        "'not run' (default: a missing results file is an error)")


def run(args):
    from xmr.studies.benchmark import load_benchmark, write_benchmark

    bench = load_benchmark(args.benchmark, args.config_dir)
    paths = write_benchmark(bench, args.out_dir, args.results_root, args.runs_root, strict=not args.allow_missing)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
