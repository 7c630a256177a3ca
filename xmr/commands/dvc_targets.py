"""xmr dvc-targets: the Snakemake targets of the reproduced DVC stages (what `make sync` touches)."""

HELP = "print the Snakemake targets of the DVC stages in dvc.lock whose files exist (for `make sync`)"


def add_arguments(p):
    p.add_argument("--lock", default="dvc.lock", help="DVC lock file (default: dvc.lock)")
    p.add_argument("--all", action="store_true", help="also targets whose files are missing")


def run(args):
    from xmr.layout import dvc_snakemake_targets

    print(" ".join(dvc_snakemake_targets(args.lock, existing_only=not args.all)))
