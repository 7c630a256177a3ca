"""xmr model-zoo: docs/model_zoo.md from the recipes with a checkpoint: section (xmr.studies.zoo)."""

HELP = ("write the model-zoo page (docs/model_zoo.md): every released model's recipe, where it is published, the "
        "paper's rows and xmr's numbers where a results file exists")


def add_arguments(p):
    p.add_argument("--out", default="docs/model_zoo.md")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--results-root", default="results", help="where results/{dataset}/{name}[_fr].json are read")


def run(args):
    from xmr.studies.zoo import write_zoo, zoo_entries

    out = write_zoo(args.out, args.config_dir, args.results_root)
    print(f"wrote {out} ({len(zoo_entries(args.config_dir))} models)")
