"""xmr test: evaluate a trained run's test similarity matrix under its dataset's protocols."""

HELP = "evaluate a trained run on its test split (dataset protocols, optional re-ranker) and write results JSON"


def add_arguments(p):
    p.add_argument("--run", required=True, help="run directory written by `xmr train`")
    p.add_argument("--sims", required=True, help="similarity matrix from `xmr score`")
    p.add_argument("--rerank", help="a registered re-ranker name (e.g. fr, rr, dsl; see xmr.rerank.RERANKERS)")
    p.add_argument("--reranks", nargs="+", metavar="NAME",
                   help="evaluate plain (none) and/or several re-rankers with their default parameters into one "
                        "JSON {by_rerank: {name: results}} (the seeded benchmark's per-run file)")
    p.add_argument("--rerank-param", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="re-ranker parameters: numbers, or paths (qbnorm: bank_i2t=A.npy bank_t2i=B.npy)")
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--metrics-out", metavar="M.json",
                   help="also a compact metrics JSON (R@1/5/10 and RSUM per protocol and subset: DVC's metrics)")
    p.add_argument("--ranks-out", metavar="R.npz",
                   help="also each query's rank of its first positive (headline protocol, per re-ranker) and the "
                        "split's subset masks: what the seeded benchmark's query-level test reads")
    p.add_argument("--dataset", help="the matrix is of another dataset's test split (`xmr score --dataset`): its "
                                     "protocols, `trained_on` in the results; nothing logged to MLflow")
    p.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")


def run(args):
    from xmr.core.errors import XmrError
    from xmr.run.config import load_saved_config

    load_saved_config(args.run)  # a missing or unreadable run directory fails in one line, before torch loads
    from xmr.run.results import evaluate_run, write_results

    if args.reranks:
        from xmr.run.results import evaluate_run_many

        if args.rerank or args.rerank_param:
            raise XmrError("--reranks evaluates each re-ranker with its defaults; drop --rerank/--rerank-param")
        res = evaluate_run_many(args.run, args.sims, args.reranks, track=not args.no_tracking,
                                keep_ranks=bool(args.ranks_out), dataset=args.dataset)
        _write_ranks(args.ranks_out, res)
        write_results(res, args.out, args.metrics_out)
        print(f"{_who(res)}: " + ", ".join(f"{k} RSUM {v['rsum']:.1f}" for k, v in res["by_rerank"].items()))
        return
    from xmr.config.loader import parse_assignments

    params = {}
    for k, v in parse_assignments(args.rerank_param, "--rerank-param", raw=True, form="NAME=VALUE").items():
        try:
            params[k] = float(v)
        except ValueError:  # a path (qbnorm's bank_i2t / bank_t2i); the re-ranker checks it
            params[k] = v
    res = evaluate_run(args.run, args.sims, args.rerank, params, track=not args.no_tracking,
                       keep_ranks=bool(args.ranks_out), dataset=args.dataset)
    _write_ranks(args.ranks_out, res)
    write_results(res, args.out, args.metrics_out)
    i, t = res["i2t"], res["t2i"]
    print(f"{_who(res)} [{res['protocol']}, rerank={res['rerank']}]  "
          f"i2t R@1/5/10 {i['r1']:.1f}/{i['r5']:.1f}/{i['r10']:.1f}  "
          f"t2i R@1/5/10 {t['r1']:.1f}/{t['r5']:.1f}/{t['r10']:.1f}  RSUM {res['rsum']:.1f}")


def _write_ranks(path, res) -> None:
    if path:
        from xmr.run.results import write_query_ranks

        write_query_ranks(path, res)  # pops the arrays: the JSON gets none


def _who(res) -> str:
    """The recipe, and the dataset it was evaluated on when that is not the one it was trained on."""
    return res["recipe"] + (f" on {res['dataset']} (trained on {res['trained_on']})" if "trained_on" in res else "")
