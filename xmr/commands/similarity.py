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
    add_element_arguments(p)


def add_element_arguments(p: argparse.ArgumentParser) -> None:
    """DivE Table 5's ablated evaluation: score with some elements of each image / caption set left out (shared by
    ``xmr similarity``, ``xmr evaluate --images`` and ``xmr score``)."""
    for side in ("image", "caption"):
        g = p.add_mutually_exclusive_group()
        g.add_argument(f"--{side}-elements", type=int, nargs="+", metavar="I",
                       help=f"keep only these 0-based elements of each {side} set (the paper's S(i) is i-1)")
        g.add_argument(f"--drop-{side}-elements", type=int, nargs="+", metavar="I",
                       help=f"leave these 0-based elements of each {side} set out of the similarity")


def kept_elements(args: argparse.Namespace, images, captions) -> tuple:
    """``images`` and ``captions`` with the set elements the element options leave out removed."""
    from xmr.similarity.measures import select_set_elements

    return (select_set_elements(images, args.image_elements, args.drop_image_elements, "image"),
            select_set_elements(captions, args.caption_elements, args.drop_caption_elements, "caption"))


def similarity_of_files(args: argparse.Namespace):
    """The (N, M) similarity tensor of ``--images`` and ``--captions`` under ``--measure`` (on ``--device``)."""
    from xmr.core.io import load_array
    from xmr.similarity.measures import MATCH_MEASURES, compute_similarity

    images = load_array(args.images, "image embeddings", mmap=True)
    captions = load_array(args.captions, "caption embeddings", mmap=True)
    images, captions = kept_elements(args, images, captions)
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
