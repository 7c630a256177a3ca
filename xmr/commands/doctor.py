"""xmr doctor: what a dataset / target needs and what is missing, each with its fix (xmr.planning.doctor)."""

HELP = "preflight: list what results/DATASET/TARGET.json needs, what is missing, and how to fix each piece"


def add_arguments(p):
    p.add_argument("dataset", nargs="?", help="dataset name (config/datasets/NAME.yaml), e.g. coco; or a target "
                   "path alone, results/DATASET/TARGET.json")
    p.add_argument("target", nargs="?", help="results/DATASET/RECIPE[_RERANKER].json or RECIPE[_RERANKER]; "
                                             "without it, only the dataset's files and the tracking store")
    p.add_argument("--zoo", action="store_true",
                   help="every model-zoo target (recipes with a checkpoint: section, docs/model_zoo.md) instead")
    p.add_argument("--config-dir", default="config")


def run(args):
    from xmr.core.errors import XmrError
    from xmr.planning.doctor import doctor, format_zoo, target_path_dataset, zoo_doctor

    if args.zoo:
        if args.dataset or args.target:
            raise XmrError("doctor --zoo checks every zoo target; give no DATASET/TARGET with it")
        reports = zoo_doctor(args.config_dir)
        print(format_zoo(reports))
        return 1 if any(r.missing for r in reports) else 0
    if not args.dataset:
        raise XmrError("doctor: give a DATASET (e.g. coco) and optionally a TARGET, or --zoo")
    dataset, target = args.dataset, args.target
    if target is None and (m := target_path_dataset(dataset)):  # `xmr doctor results/coco/dvse_fr.json`
        dataset, target = m, dataset
    rep = doctor(dataset, target, args.config_dir)
    print(rep.format())
    return 1 if rep.missing else 0
