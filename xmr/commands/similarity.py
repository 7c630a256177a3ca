"""``xmr similarity``: image-caption similarity matrix from saved embeddings (single vectors or sets)."""

from __future__ import annotations

import argparse

HELP = "similarity matrix (images x captions) of saved embeddings, chunked; writes S.npy"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_embedding_arguments(p, required=True)
    p.add_argument("--device", default=None, help="torch device, e.g. cpu or cuda (default: cpu)")
    p.add_argument("--out", required=True, metavar="S.npy", help="output similarity matrix, float32 (N, M)")


def add_embedding_arguments(p: argparse.ArgumentParser, required: bool) -> None:
    """The embedding inputs and the measure (shared with ``xmr evaluate --images/--captions``)."""
    p.add_argument("--images", required=required, metavar="I.npy", help="image embeddings, (N, D) or (N, K, D)")
    p.add_argument("--captions", required=required, metavar="C.npy", help="caption embeddings, (M, D) or (M, L, D)")
    p.add_argument("--measure", default="cosine",
                   choices=["cosine", "max", "mean", "chamfer", "smooth_chamfer", "match_prob", "log_match_prob"],
                   help="cosine for single vectors; set measures for (N, K, D) / (M, L, D) (default: cosine)")
    p.add_argument("--alpha", type=float, default=16.0, help="smooth-Chamfer temperature α (default: 16, DivE)")
    p.add_argument("--mp-a", type=float, default=5.0,
                   help="(log_)match_prob scale a (PCME negative_scale; default 5)")
    p.add_argument("--mp-b", type=float, default=5.0, help="(log_)match_prob shift b (PCME shift; default 5)")
    p.add_argument("--chunk-size", type=int, default=None, help="images per block (default: from a memory budget)")


def similarity_of_files(args: argparse.Namespace):
    """The (N, M) similarity tensor of ``--images`` and ``--captions`` under ``--measure`` (on ``--device``)."""
    from xmr.core.io import load_array
    from xmr.similarity.measures import MATCH_MEASURES, compute_similarity

    images = load_array(args.images, "image embeddings", mmap=True)
    captions = load_array(args.captions, "caption embeddings", mmap=True)
    params = {"a": args.mp_a, "b": args.mp_b} if args.measure in MATCH_MEASURES else {}
    return compute_similarity(images, captions, measure=args.measure, alpha=args.alpha, chunk_size=args.chunk_size,
                              device=args.device, **params)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from xmr.core.io import atomic_path
    from xmr.similarity.measures import similarity_to_numpy

    sims = similarity_of_files(args)
    with atomic_path(args.out, ".npy") as tmp, open(tmp, "wb") as f:
        np.save(f, similarity_to_numpy(sims))
    print(f"{args.out}: {sims.shape[0]} x {sims.shape[1]} {args.measure} similarities")
    return 0
