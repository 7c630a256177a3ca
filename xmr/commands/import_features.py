"""xmr import-features: precomputed features (SCAN precomp folder, BUTD TSV) into the HDF5 feature store."""

HELP = "import precomputed features (SCAN/VSE∞ precomp .npy, bottom-up-attention TSV) into xmr's HDF5 layout"


def add_arguments(p):
    p.add_argument("--format", required=True, choices=["scan", "butd_tsv"], help="source layout")
    p.add_argument("--src", required=True, nargs="+",
                   help="scan: the precomp folder ({split}_ims.npy, _caps.txt, _ids.txt); butd_tsv: the TSV "
                        "file(s), read in the order given")
    p.add_argument("--src-split", help="scan: source split (train/dev/test/testall); default: from the dataset "
                                       "config (extra.scan_splits; val -> dev, test -> test)")
    p.add_argument("--dataset", help="dataset name (config/datasets/NAME.yaml) or path: write rows in the order of "
                                     "its --split, with its image ids (recommended)")
    p.add_argument("--split", help="xmr split of --dataset (train/val/test)")
    p.add_argument("--out", required=True, help="output .h5, e.g. features/coco/scan_butd36/test.h5")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    p.add_argument("--no-verify-captions", action="store_true",
                   help="scan with an ids file: do not compare its captions with the dataset's")
    p.add_argument("--pooled", action="store_true",
                   help="scan: the _ims.npy is 2-D N x D (one pooled vector per image); default: N x R x D "
                        "regions (also set by the dataset config's extra.pooled)")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    from xmr.core.errors import XmrError
    from xmr.features.importers import import_butd_tsv, import_scan, scan_source_split

    split = ds = None
    if args.dataset:
        from xmr.config.loader import load_dataset_config
        from xmr.data import load_split

        if not args.split:
            raise XmrError("--dataset needs --split (the xmr split whose image order the file gets)")
        ds = load_dataset_config(args.dataset, args.config_dir)
        split = load_split(ds, args.split)
    elif args.split:
        raise XmrError("--split needs --dataset")
    if args.format == "scan":
        if len(args.src) != 1:
            raise XmrError("--format scan takes one --src folder")
        src_split = args.src_split or (scan_source_split(ds, args.split) if ds else None)
        if not src_split:
            raise XmrError("--format scan needs --src-split (or --dataset and --split to derive it)")
        out = import_scan(args.src[0], src_split, args.out, split=split, dtype=args.dtype,
                          verify_captions=not args.no_verify_captions, progress=not args.no_progress,
                          pooled=args.pooled or bool((ds or {}).get("extra", {}).get("pooled", False)))
    else:
        if args.src_split:
            raise XmrError("--src-split applies to --format scan only")
        out = import_butd_tsv(args.src, args.out, split=split, dtype=args.dtype, progress=not args.no_progress)
    print(f"wrote {out}")
