"""``xmr figure``: the seed papers' analysis figures from trained runs, one PNG each (docs/report.md "Analysis
figures"): t-SNE of the embedding space, attention or region maps of each sub-embedding (with the nearest caption
of each set element), two runs' retrievals side by side, and any training-history column over the epochs."""

from __future__ import annotations

import argparse

HELP = "analysis figures of trained runs: tsne, maps (attention / regions / nearest captions), compare, curves"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="figure", metavar="FIGURE", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", required=True, metavar="F.png", help="the figure")
    common.add_argument("--machine", default=None,
                        help="the machine named in the figure's footer (default: the CPU's name and core count)")
    t = sub.add_parser("tsne", parents=[common], help="t-SNE of image and caption set elements (DivE Fig. A1, "
                                                      "CODER Fig. 3): one panel per run")
    t.add_argument("--run", nargs="+", required=True, help="run directories (the same dataset)")
    t.add_argument("--images", type=int, default=100, help="test images shown, with one caption each (default 100)")
    t.add_argument("--seed", type=int, default=0, help="which images, and t-SNE's seed")
    t.add_argument("--split", default=None, help="default: the dataset's test split")
    t.add_argument("--all-captions", action="store_true",
                   help="every caption of the shown images (CODER Fig. 3: 1,000 images, 5,000 captions)")
    t.add_argument("--element", type=int, default=None,
                   help="only this 0-based element of each set (CODER's [instance, concept]: 0 = instance)")
    m = sub.add_parser("maps", parents=[common], help="each image sub-embedding's map over test images: attention "
                                                      "(DivE Fig. 4) or regions ranked by cosine (DVSE Fig. 10)")
    m.add_argument("--run", required=True, help="a set method's run directory (DVSE, PVSE, DivE)")
    m.add_argument("--weights", default="attention", choices=["attention", "similarity"],
                   help="attention: the heads' weights; similarity: each region's cosine with the sub-embedding")
    m.add_argument("--captions", action="store_true",
                   help="under each map, the test caption nearest to that set element (DivE Fig. 4, A2, A3)")
    m.add_argument("--images", type=int, default=2, help="test images (default 2)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--split", default=None)
    c = sub.add_parser("compare", parents=[common], help="two runs' retrievals side by side (DVSE Figs. 11-12, "
                                                         "CODER Fig. 4)")
    c.add_argument("--run", nargs=2, required=True, metavar=("A", "B"), help="the two run directories")
    c.add_argument("--sims", nargs=2, required=True, metavar=("A.npy", "B.npy"),
                   help="their similarity matrices of the split (xmr score)")
    c.add_argument("--direction", default="t2i", choices=["t2i", "i2t"],
                   help="t2i: caption queries, images shown (DVSE Fig. 11); i2t: image queries, captions (Fig. 12)")
    c.add_argument("--queries", type=int, default=3, help="queries, those the runs answer differently first")
    c.add_argument("--top-k", type=int, default=4, help="answers shown per run (DVSE: 4 images, 5 captions)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--split", default=None)
    h = sub.add_parser("curves", parents=[common], help="a history.csv column per epoch, one line per run "
                                                        "(VSE+2AD Fig. C-2: train_k; Fig. A.2-1: val_rsum)")
    h.add_argument("--run", nargs="+", required=True, help="run directories")
    h.add_argument("--column", default="val_rsum", help="history.csv column (default val_rsum; ADOPT's K: train_k)")
    h.add_argument("--labels", nargs="+", default=None, help="a legend label per run (default: its folder name)")


def run(args: argparse.Namespace) -> int:
    from xmr.run.config import load_saved_config

    runs = args.run if isinstance(args.run, list) else [args.run]
    for r in runs:
        load_saved_config(r)  # a missing run directory fails in one line, before torch loads
    if args.figure == "tsne":
        from xmr.report.analysis_figures import tsne_figure

        info = tsne_figure(runs, args.out, args.images, args.seed, args.split, machine=args.machine,
                           all_captions=args.all_captions, element=args.element)
        print(f"wrote {args.out}: " + ", ".join(f"{r} {v['points']} points, {v['slots']} slot(s)"
                                                for r, v in info.items()))
    elif args.figure == "maps":
        from xmr.report.figures import attention_figure

        info = attention_figure(args.run, args.out, args.images, args.seed, args.split, weights=args.weights,
                                with_captions=args.captions, machine=args.machine)
        print(f"wrote {args.out}: {args.weights} of {info['num_embeds']} sub-embeddings on images "
              f"{', '.join(map(str, info['images']))}")
    elif args.figure == "compare":
        from xmr.report.analysis_figures import compare_figure

        info = compare_figure(args.run[0], args.sims[0], args.run[1], args.sims[1], args.out, args.queries,
                              args.top_k, args.seed, args.split, machine=args.machine, direction=args.direction)
        what = "captions" if args.direction == "t2i" else "images"
        print(f"wrote {args.out}: query {what} {info['queries']}, ground-truth ranks (A, B) {info['gt_ranks']}")
    else:
        from xmr.report.analysis_figures import curves_figure

        series = curves_figure(runs, args.column, args.out, args.labels, machine=args.machine)
        print(f"wrote {args.out}: {args.column} of " + ", ".join(f"{n} ({len(p)} epochs)" for n, p in series.items()))
    return 0
