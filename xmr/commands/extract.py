"""xmr extract: visual features of one dataset split with one backbone, into the HDF5 feature store."""

HELP = "extract visual features for a dataset split with a configured backbone (resumable, HDF5 output)"


def add_arguments(p):
    p.add_argument("--dataset", required=True, help="dataset name (config/datasets/NAME.yaml) or path")
    p.add_argument("--backbone", required=True, help="key in config/backbones.yaml")
    p.add_argument("--split", required=True)
    p.add_argument("--out", required=True, help="output .h5 path")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--batch-size", type=int, help="default: the backbone config's batch_size")
    p.add_argument("--workers", type=int, help="image decoding processes (default: one fewer than the CPUs this "
                   "process may use, at most 16; 0 decodes in the main process)")
    p.add_argument("--threads", type=int, help="torch CPU threads of the backbone (default: torch's, one per "
                   "core); fixed, it makes the features the same on any core count")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    from xmr.config.loader import load_backbone_config, load_dataset_config
    from xmr.core.errors import XmrError
    from xmr.data import load_split
    from xmr.core.cpus import available_cpus
    from xmr.planning.jobs import extract_workers

    if args.threads is not None and args.threads < 1:
        raise XmrError(f"--threads {args.threads}: give a positive number of CPU threads")
    if args.workers is not None and args.workers < 0:
        raise XmrError(f"--workers {args.workers}: give 0 (decode in the main process) or more worker processes")
    workers = extract_workers(available_cpus()) if args.workers is None else args.workers
    bb = load_backbone_config(args.backbone, args.config_dir)
    if bb["name"] == "precomputed":  # before the dataset is read: nothing here can make these features
        from xmr.features.backbones.precomputed import not_extractable

        raise not_extractable(bb, args.dataset, args.split, args.out)
    ds = load_dataset_config(args.dataset, args.config_dir)
    split = load_split(ds, args.split)
    from xmr.features.extract import extract_features  # torch: after the options and inputs are checked

    n = split.num_images
    print(f"extract {ds['name']}/{args.split}: {n} image{'s' * (n != 1)}, {workers} decoding "
          f"worker{'s' * (workers != 1)}", flush=True)
    out = extract_features(split, bb, args.out, batch_size=args.batch_size or bb["batch_size"],
                           workers=workers, dtype=bb["dtype"], device=args.device,
                           progress=not args.no_progress, threads=args.threads)
    print(f"wrote {out} ({split.num_images} images)")
