"""xmr train: train one recipe (method x dataset x backbone) with the one trainer."""

HELP = "train a run config (config/recipes/DATASET/RECIPE.yaml); resumes from OUT_DIR/last.pt"


def add_arguments(p):
    p.add_argument("--config", required=True, help="run config YAML")
    p.add_argument("--out-dir", required=True, help="run directory (checkpoints, history, config)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY.PATH=VALUE", help="config overrides")
    p.add_argument("--no-resume", action="store_true", help="start over even if OUT_DIR/last.pt exists")
    p.add_argument("--no-progress", action="store_true")


def run(args):
    from xmr.config import load_run_config
    from xmr.train.trainer import train

    cfg = load_run_config(args.config, args.set)
    summary = train(cfg, args.out_dir, resume=not args.no_resume, progress=not args.no_progress)
    print(f"best validation RSUM {summary['best_val_rsum']:.1f} at epoch {summary['best_epoch']} -> {args.out_dir}")
