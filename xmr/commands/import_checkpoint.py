"""xmr import-checkpoint: a published checkpoint (VSE++, VSE∞, PCME, PVSE) -> an ordinary xmr run directory."""

HELP = "import a published checkpoint (vsepp, vse_infty, pcme, pvse) as a run directory (best.pt, config.yaml, ...)"


def add_arguments(p):
    from xmr.core.registry import RegistryNames

    # a metavar: argparse would list the choices (import the formats, and torch) while building the parser
    p.add_argument("--format", choices=RegistryNames("xmr.checkpoints", "CHECKPOINT_FORMATS"), metavar="FORMAT",
                   help="the official layout: %(choices)s (default: the recipe's checkpoint.format)")
    p.add_argument("--src", help="the official checkpoint file (default: the recipe's checkpoint.src)")
    p.add_argument("--vocab", help="what the text side needs: the vocabulary file (BiGRU models) or the local BERT "
                                   "folder (BERT models)")
    p.add_argument("--recipe", help="a recipe with a checkpoint: section (config/recipes/{dataset}/{name}.yaml): "
                                    "its settings and checkpoint are used")
    p.add_argument("--dataset", help="without --recipe: the dataset the model is evaluated on (e.g. coco)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a documented option of the format (repeatable; docs/checkpoints.md)")
    p.add_argument("--set", nargs="*", action="extend", default=[], metavar="KEY.PATH=VALUE",
                   help="config overrides (e.g. eval.batch_size=256)")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--out", required=True, help="run directory to write, e.g. runs/coco/vse_inf_official_bigru")


def run(args):
    from xmr.checkpoints.importer import import_checkpoint
    from xmr.config.loader import parse_assignments

    out = import_checkpoint(args.out, fmt=args.format, src=args.src, vocab=args.vocab, recipe=args.recipe,
                            dataset=args.dataset, options=parse_assignments(args.option, "--option"), overrides=tuple(args.set),
                            config_dir=args.config_dir)
    print(f"wrote {out}/best.pt, config.yaml, provenance.json")
