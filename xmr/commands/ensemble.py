"""``xmr ensemble``: the mean of several runs' similarity matrices (config/ensembles/{dataset}/{name}.yaml), or of
any ``.npy`` matrices given by path."""

from __future__ import annotations

import argparse

HELP = ("mean of trained runs' similarity matrices (config/ensembles/DATASET/NAME.yaml) into runs/DATASET/NAME/, "
        "or of .npy matrices (--sims A.npy B.npy --out M.npy)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset", help="the ensemble's dataset (config/ensembles/DATASET/NAME.yaml)")
    p.add_argument("--name", help="the ensemble's name; writes runs/DATASET/NAME/MATRIX.npy, config.yaml, "
                                  "ensemble.json")
    p.add_argument("--matrix", default="test_sims", choices=["test_sims", "qbnorm_bank_i2t", "qbnorm_bank_t2i"],
                   help="which matrix of the members' run directories to average (default: test_sims)")
    p.add_argument("--sims", nargs="+", metavar="S.npy", help="instead of an ensemble file: these matrices")
    p.add_argument("--weights", nargs="+", type=float, metavar="W",
                   help="with --sims: one positive weight per matrix (default: equal)")
    p.add_argument("--out", metavar="M.npy", help="with --sims: the mean matrix (float32)")
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    p.add_argument("--config-dir", default="config")
    p.add_argument("--runs-root", default="runs")


def run(args: argparse.Namespace) -> None:
    from xmr.core.errors import XmrError
    from xmr.studies.ensembles import build_ensemble, load_ensemble, mean_matrix

    if args.sims:
        if args.dataset or args.name:
            raise XmrError("give either --sims ... --out M.npy, or --dataset and --name, not both")
        if not args.out:
            raise XmrError("--sims needs --out M.npy (where the mean matrix goes)")
        mean = mean_matrix(args.sims, args.out, args.weights, progress=not args.no_progress)
        print(f"wrote {args.out}: mean of {len(args.sims)} matrices, shape {mean.shape[0]} x {mean.shape[1]}")
        return
    if not (args.dataset and args.name):
        raise XmrError("name the ensemble with --dataset DATASET --name NAME (config/ensembles/DATASET/NAME.yaml), "
                       "or give matrices with --sims A.npy B.npy --out M.npy")
    if args.weights or args.out:
        raise XmrError("--weights and --out go with --sims; an ensemble file holds its own weights")
    ens = load_ensemble(args.dataset, args.name, args.config_dir)
    out = build_ensemble(ens, args.matrix, args.runs_root, progress=not args.no_progress)
    print(f"wrote {out}: mean of {', '.join(ens.members)}"
          + (f" (weights {', '.join(f'{w:g}' for w in ens.weights)})" if len(set(ens.weights)) > 1 else ""))
