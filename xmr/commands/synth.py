"""xmr synth: generate the embedded synthetic dataset (images + Karpathy-format captions)."""

HELP = "generate the embedded synthetic dataset from its dataset config (deterministic in the seed), or print its statistics"


def add_arguments(p):
    p.add_argument("--dataset", default="synth", help="dataset name or config path (default: synth)")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--out", help="output folder (default: the config's root; with --set values that differ from the "
                                 "config's, ROOT_KEY-VALUE..., so the workflow's dataset is never overwritten)")
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                   help="override generator arguments, e.g. n_train=500 seed=1 style=v1")
    p.add_argument("--stats", metavar="DATASET_JSON",
                   help="print statistics of a generated file as JSON (false_negative_rate_b128, caption length, "
                        "vocabulary, objects per image, ambiguous subset) instead of generating")
    p.add_argument("--batches", type=int, default=100, help="with --stats: random batches for the false-negative rate")
    p.add_argument("--workers", type=int, default=1,
                   help="processes that render and encode the images (default 1: this one); the same files")


def run(args):
    if args.stats:
        import json

        from xmr.data.synth import synth_stats

        print(json.dumps(synth_stats(args.stats, batches=args.batches), indent=2))
        return

    from xmr.config.loader import load_dataset_config, parse_assignments
    from xmr.core.errors import XmrError
    from xmr.data.synth import generate_synth

    cfg = load_dataset_config(args.dataset, args.config_dir)
    if "generate" not in cfg:
        raise XmrError(f"dataset {cfg['name']} has no `generate:` section; only synthetic datasets are generated")
    gen = dict(cfg["generate"])
    changed = {k: v for k, v in parse_assignments(args.set, "--set").items() if gen.get(k, object()) != v}
    gen.update(changed)
    gen.setdefault("captions_per_image", cfg["captions_per_image"])
    try:
        path = generate_synth(args.out or default_out(cfg["root"], changed), workers=args.workers, **gen)
    except TypeError as e:
        raise XmrError(f"synth generator: {e}") from None
    print(f"wrote {path}")


def default_out(root: str, changed: dict) -> str:
    """Where ``xmr synth --set ...`` writes without ``--out``: the config's root when nothing differs from the
    config, else a sibling folder named by the changes (``data/synth_style-v1``): the workflow's dataset (and the
    features, runs and results built from it) must not be replaced by a variant behind Snakemake's back."""
    if not changed:
        return root
    return str(root).rstrip("/") + "_" + "_".join(f"{k}-{v}" for k, v in changed.items())
