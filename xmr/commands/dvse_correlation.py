"""xmr dvse-correlation: DVSE Fig. 6, the sub-embedding correlation matrix of a trained set-based run."""

HELP = "plot the K x K correlation matrix of a set-based run's image sub-embeddings (DVSE Fig. 6)"


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory written by `xmr train` (dvse, pvse, dive)")
    p.add_argument("--out", required=True, help="output PNG")
    p.add_argument("--split", help="default: the dataset's test split")
    p.add_argument("--kind", default="embeddings", choices=["embeddings", "residuals"],
                   help="final sub-embeddings, or the attention residuals the orthogonal loss acts on")
    p.add_argument("--measure", default="cosine", choices=["cosine", "pearson"])
    p.add_argument("--absolute", action="store_true", help="average |correlation|")
    p.add_argument("--max-images", type=int, help="use the first N images of the split")
    p.add_argument("--npy", help="also save the matrix as .npy")
    p.add_argument("--device", default="auto")


def run(args):
    import numpy as np

    from xmr.core.io import atomic_path
    from xmr.evaluation.set_stats import mean_off_diagonal
    from xmr.report.dvse_figures import plot_subembedding_correlation, subembedding_correlation

    m = subembedding_correlation(args.run, args.split, args.kind, args.measure, args.absolute, args.max_images,
                                 args.device)
    title = f"{args.run}: {args.kind} ({args.measure}{', |.|' if args.absolute else ''})"
    plot_subembedding_correlation(m, args.out, title)
    if args.npy:
        with atomic_path(args.npy, ".npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, m)
    print(f"wrote {args.out} (K = {len(m)}, mean off-diagonal correlation {mean_off_diagonal(m):.3f})")
