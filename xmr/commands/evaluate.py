"""``xmr evaluate``: retrieval metrics of a saved similarity matrix, or of saved embeddings (their similarity
computed in the same process: no matrix on disk), under a published protocol, optionally re-ranked. Writes the
metrics JSON (see docs/evaluation.md)."""

from __future__ import annotations

import argparse

HELP = ("R@K/medr/meanr/RSUM (or CUB R-Precision) of a similarity matrix or of image + caption embeddings; "
        "optional re-ranking; writes M.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from xmr.commands.similarity import add_embedding_arguments

    p.add_argument("--sims", metavar="S.npy",
                   help="similarity matrix, rows = images, cols = captions (or --images/--captions instead)")
    add_embedding_arguments(p, required=False)
    p.add_argument("--protocol", default="plain", choices=["coco1k", "coco5k", "f30k", "plain", "cub", "eccv", "cxc"],
                   help="coco1k: 5-fold mean on 5000x25000; coco5k: 5000x25000; f30k: 1000x5000; plain: any N x c*N; "
                        "cub: class-level relevance from labels; eccv / cxc: COCO 5K plus ECCV Caption mAP@R, "
                        "R-Precision, R@1 / CxC R@K (default: plain)")
    p.add_argument("--captions-per-image", type=int, default=5, metavar="C",
                   help="captions C*i .. C*i+C-1 belong to image i (default: 5)")
    p.add_argument("--ties", default="pessimistic", choices=["pessimistic", "optimistic", "index"],
                   help="order of tied scores (default: pessimistic; see docs/evaluation.md)")
    p.add_argument("--rerank", default=None, metavar="NAME",  # checked against the registry (xmr.rerank.RERANKERS)
                   help="re-rank the matrix first with a registered re-ranker, e.g. fr, rr, dsl (default: none)")
    p.add_argument("--rerank-param", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="re-ranker parameters, several after one flag or the flag repeated (e.g. gamma1=25 lambda2=25 for fr; "
                        "bank_i2t=B.npy for qbnorm)")
    p.add_argument("--rerank-defaults", default=None, metavar="DATASET",
                   help="row of config/rerank/<name>.yaml for default parameters (default: the protocol's dataset)")
    p.add_argument("--image-labels", default=None, metavar="L.npy", help="cub: class label per image (N,)")
    p.add_argument("--caption-labels", default=None, metavar="L.npy",
                   help="cub: class label per caption (M,) (default: image labels repeated per caption)")
    p.add_argument("--image-ids", default=None, metavar="IDS",
                   help="eccv/cxc: COCO image id of each matrix row (text, one per line, or .npy; default: the "
                        "eccv-caption package's order)")
    p.add_argument("--caption-ids", default=None, metavar="IDS",
                   help="eccv/cxc: COCO caption id of each matrix column (default: each image's captions in the "
                        "package's order)")
    p.add_argument("--device", default=None, help="torch device for similarity and evaluation (default: cpu)")
    p.add_argument("--timing", action="store_true", help="add re-rank and ranking wall times to the JSON")
    p.add_argument("--out", required=True, metavar="M.json", help="metrics JSON")


def summary(m: dict) -> str:
    if "rsum" in m:
        line = (f"i2t R@1/5/10 {m['i2t']['r1']:.1f}/{m['i2t']['r5']:.1f}/{m['i2t']['r10']:.1f}  "
                f"t2i R@1/5/10 {m['t2i']['r1']:.1f}/{m['t2i']['r5']:.1f}/{m['t2i']['r10']:.1f}  rsum {m['rsum']:.1f}")
    else:
        line = (f"i2t R-P {m['i2t']['r_precision']:.1f} R@1 {m['i2t']['r1']:.1f}  "
                f"t2i R-P {m['t2i']['r_precision']:.1f} R@1 {m['t2i']['r1']:.1f}")
    if "extended" in m:
        e = m["extended"]
        line += "  " + "  ".join(f"{d} mAP@R/R-P/R@1 {e[d]['map_at_r']:.1f}/{e[d]['r_precision']:.1f}/{e[d]['r1']:.1f}"
                                 for d in ("i2t", "t2i")) + f" ({e['positives']})"
    if "cxc" in m:
        x = m["cxc"]
        line += "  " + "  ".join(f"CxC {d} R@1/5/10 {x[d]['r1']:.1f}/{x[d]['r5']:.1f}/{x[d]['r10']:.1f}"
                                 for d in ("i2t", "t2i"))
    return f"{m['protocol']} ({m['rerank']}): {line}"


def _read_ids(path: str, what: str) -> list:
    """Ids from a .npy file or a text file of one id per line."""
    from pathlib import Path

    from xmr.core.io import load_array, require_file
    from xmr.data.precomp import read_lines

    if path.endswith(".npy"):
        return load_array(path, what + "s", numeric=False).reshape(-1).tolist()
    return read_lines(require_file(path, f"give the {what}s, one per line"), what)


def run(args: argparse.Namespace) -> int:
    from xmr.config.loader import parse_assignments
    from xmr.core.errors import XmrError
    from xmr.core.io import load_array

    embeddings = [f"--{k}" for k in ("images", "captions") if getattr(args, k)]
    if bool(args.sims) == bool(embeddings):
        raise XmrError("give either --sims S.npy or --images I.npy --captions C.npy (with --measure), not both"
                       if args.sims else "give --sims S.npy, or --images I.npy --captions C.npy (with --measure)")
    if embeddings and len(embeddings) == 1:
        raise XmrError(f"{embeddings[0]} given alone: give both --images and --captions")
    params = parse_assignments(args.rerank_param, "--rerank-param", raw=True, form="NAME=VALUE")  # typed by the spec
    if params and not args.rerank:
        raise XmrError("--rerank-param given without --rerank")
    from xmr.commands.similarity import similarity_of_files  # torch: after the options are checked
    from xmr.evaluation import evaluate_sims

    sims = load_array(args.sims, "similarity matrix", mmap=True) if args.sims else similarity_of_files(args)
    inputs = {}  # labels (cub), ids (eccv, cxc)
    if args.image_labels:
        inputs["image_labels"] = load_array(args.image_labels, "image labels", numeric=False)
    if args.caption_labels:
        inputs["caption_labels"] = load_array(args.caption_labels, "caption labels", numeric=False)
    if inputs.keys() & {"image_labels", "caption_labels"} and args.protocol != "cub":
        raise XmrError("--image-labels/--caption-labels are only used by --protocol cub")
    ids = {}
    for flag in ("image_ids", "caption_ids"):
        if getattr(args, flag):
            if args.protocol not in ("eccv", "cxc"):
                raise XmrError(f"--{flag.replace('_', '-')} orders the matrix for --protocol eccv or cxc only")
            ids[flag] = _read_ids(getattr(args, flag), flag.replace("_", " ")[:-1])
    if args.protocol in ("eccv", "cxc"):  # the package's annotations, in the rows' order: read here, at the edge
        from xmr.data.coco_positives import coco_positives
        from xmr.evaluation import get_protocol

        if tuple(sims.shape) == get_protocol(args.protocol).shape:  # else the evaluator's one line on the shape
            inputs["positives"] = coco_positives(args.protocol, ids.get("image_ids"), ids.get("caption_ids"))
    rows = {}
    if args.rerank:  # config and arrays are read here, at the edge: the evaluator and re-rankers open no files
        from xmr.config.loader import load_array_params, load_rerank_rows
        from xmr.rerank import rows_name

        rows = load_rerank_rows(rows_name(args.rerank))[1]
        params = load_array_params(params, f"re-ranker {args.rerank!r}")
    metrics = evaluate_sims(sims, protocol=args.protocol, captions_per_image=args.captions_per_image,
                            rerank=args.rerank, rerank_params=params, ties=args.ties,
                            rerank_defaults=args.rerank_defaults, rerank_rows=rows, device=args.device,
                            timing=args.timing, **inputs)
    from xmr.run.results import write_results

    write_results(metrics, args.out)
    print(summary(metrics))
    from xmr.evaluation.metrics import saturated_recalls, saturation_note

    if saturated := saturated_recalls(metrics):
        print(saturation_note(saturated))
    return 0
