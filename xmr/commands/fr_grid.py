"""xmr fr-grid: Fast Re-ranking scale sensitivity (DVSE Fig. 7) of a trained run's similarity matrix."""

HELP = "evaluate FR over a grid of scales (γ1 x γ2, λ1 x λ2, tied γ x λ) and write fr_grid.{json,csv,png}"


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory written by `xmr train`")
    p.add_argument("--sims", required=True, help="similarity matrix from `xmr score` (tune on --split val)")
    p.add_argument("--gammas", nargs="+", type=float, required=True, metavar="G", help="image->text scales")
    p.add_argument("--lambdas", nargs="+", type=float, required=True, metavar="L", help="text->image scales")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--split", help="the split SIMS was scored on (default: test); used for CUB class labels")
    p.add_argument("--protocol", help="default: the dataset's headline protocol if the matrix fits it, else plain")
    p.add_argument("--device", default=None, help="torch device for the evaluations (default: CPU)")


def run(args):
    from xmr.report.fr_grid import run_fr_grid

    grid = run_fr_grid(args.run, args.sims, args.gammas, args.lambdas, args.out_dir, args.split, args.protocol,
                       args.device)
    t, f = grid["best"]["tied"], grid["best"]["free"]
    print(f"wrote {args.out_dir}/fr_grid.{{json,csv,png}} ({grid['protocol']}): "
          f"plain RSUM {grid['plain']['rsum']:.1f}; "
          f"best tied γ={t['gamma']:g} λ={t['lambda']:g} RSUM {t['rsum']:.1f}; best free γ1={f['gamma1']:g} "
          f"γ2={f['gamma2']:g} λ1={f['lambda1']:g} λ2={f['lambda2']:g} RSUM {f['rsum']:.1f}")
