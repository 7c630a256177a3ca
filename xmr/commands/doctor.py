"""xmr doctor: what a dataset / target needs and what is missing, each with its fix (xmr.doctor)."""

HELP = "preflight: list what results/DATASET/TARGET.json needs, what is missing, and how to fix each piece"


def add_arguments(p):
    p.add_argument("dataset", help="dataset name (config/datasets/NAME.yaml), e.g. coco")
    p.add_argument("target", nargs="?", help="results/DATASET/RECIPE[_RERANKER].json or RECIPE[_RERANKER]; "
                                             "without it, only the dataset's files and the tracking store")
    p.add_argument("--config-dir", default="config")


def run(args):
    from xmr.doctor import doctor

    rep = doctor(args.dataset, args.target, args.config_dir)
    print(rep.format())
    return 1 if rep.missing else 0
