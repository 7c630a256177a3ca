"""xmr text-features: precomputed caption features (HGLMM Fisher vectors + PCA) for a dataset's splits."""

HELP = "fit HGLMM Fisher-vector text features on a split and write features/DATASET/hglmm/SPLIT.h5 per split"


def add_arguments(p):
    p.add_argument("--dataset", required=True, help="dataset name (config/datasets/NAME.yaml) or path")
    p.add_argument("--kind", default="hglmm", help="entry of config/text_features.yaml")
    p.add_argument("--fit-split", help="fit the model on this split (reused if OUT_DIR/model.npz matches)")
    p.add_argument("--splits", nargs="*", default=[], help="splits to encode into OUT_DIR/SPLIT.h5")
    p.add_argument("--out-dir", required=True, help="e.g. features/DATASET/hglmm")
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="override settings, e.g. components=16 pca_dim=256")
    p.add_argument("--refit", action="store_true", help="fit again even if OUT_DIR/model.npz exists")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    from xmr.config.loader import load_dataset_config
    from xmr.core.errors import XmrError
    from xmr.text.hglmm import compute_text_features, load_text_feature_settings

    if not args.fit_split and not args.splits:
        raise XmrError("xmr text-features: nothing to do; give --fit-split and/or --splits")
    ds = load_dataset_config(args.dataset, args.config_dir)
    settings = load_text_feature_settings(args.kind, ds["name"], args.config_dir, args.set)
    report = compute_text_features(ds, args.kind, settings, args.out_dir, args.splits, args.fit_split,
                                   refit=args.refit, device=args.device, progress=not args.no_progress)
    for split, info in report["splits"].items():
        print(f"{split}: {info['captions']} captions x {info['dim']} -> {info['path']}")
