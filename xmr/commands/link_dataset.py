"""xmr link-dataset: symlink a user's copy of a real dataset into data/{dataset}/."""

HELP = "symlink a real dataset's files (config `source:` or --source DIR) into data/{dataset}/; checks the layout"


def add_arguments(p):
    p.add_argument("--dataset", required=True, help="dataset name (config/datasets/NAME.yaml) or config path")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--source", help="folder laid out like data/{dataset}/ (default: the config's `source:`)")


def run(args):
    from xmr.config.loader import load_dataset_config
    from xmr.data.link import link_dataset

    cfg = load_dataset_config(args.dataset, args.config_dir)
    made = link_dataset(cfg, args.source)
    for path in made:
        print(f"linked {path} -> {path.resolve()}")
    print(f"{cfg['annotations']}: present")
