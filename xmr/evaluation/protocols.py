"""Evaluation protocols and the one evaluator every method goes through: :func:`evaluate_sims`.

=========  ==========================  =====================================================================
protocol   matrix (images x captions)  numbers
=========  ==========================  =====================================================================
coco1k     5000 x 25000 (COCO 5K test)  five sequential folds of 1000 images x 5000 captions; every number
                                        (R@K, medr, meanr, RSUM) is the plain mean of the folds' numbers,
                                        per-fold values under ``folds``; re-rankers run per fold
coco5k     5000 x 25000                 the whole matrix
f30k       1000 x 5000                  the whole matrix (Flickr30K 1K test)
plain      N x c·N                      the whole matrix, any N and ``captions_per_image`` c
cub        N x M + class labels         R-Precision and R@{1,5,10} with class-level relevance (PCME, DVSE Tab. III)
eccv       5000 x 25000                 coco5k's numbers plus ``extended``: ECCV Caption mAP@R, R-Precision, R@1
cxc        5000 x 25000                 coco5k's numbers plus ``cxc``: CxC R@1/5/10
=========  ==========================  =====================================================================

Extended positives (:mod:`xmr.evaluation.extended`): ``eccv`` and ``cxc`` take theirs as ``positives``, read at the
edge from the eccv-caption package (:func:`xmr.data.coco_positives.coco_positives`, which also orders them by the
rows' COCO ids); any other single-fold protocol given ``positives`` (a dataset's own, e.g. synth's) adds
``extended`` beside its R@K, and to each subset.

Caption c·i .. c·i+c-1 belong to image i. Image->text ranks the best of an image's captions, text->image the
caption's image; see :mod:`xmr.evaluation.ranks` for the tie policies and :mod:`xmr.evaluation.metrics` for
the metric definitions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.lazy import is_tensor, torch  # a NumPy matrix with a NumPy-capable re-ranker never imports torch
from xmr.evaluation.extended import ExtendedPositives, extended_metrics, recall_at_k
from xmr.evaluation.metrics import class_metrics, mean_of, recall_metrics, rsum
from xmr.evaluation.ranks import check_grouping, check_matrix, check_ties, grouped_ranks, label_ranks
from xmr.rerank import DEFAULT_BLOCK_BYTES, RERANKERS, RerankContext, Rescoring, describe_params, resolve_params


@dataclass(frozen=True)
class Protocol:
    name: str
    description: str
    shape: tuple[int, int] | None = None  # required matrix shape
    captions_per_image: int | None = None  # fixed c, if the protocol has one
    folds: int = 1
    rerank_dataset: str = "default"  # row of config/rerank/<name>.yaml used for default parameters
    class_level: bool = False
    extended: str | None = None  # eccv / cxc: positives from the eccv-caption package


#: protocol -> the name of the positives it scores (``ExtendedPositives.source``)
SOURCE_OF = {"eccv": "eccv_caption", "cxc": "cxc"}

PROTOCOLS: dict[str, Protocol] = {p.name: p for p in (
    Protocol("coco1k", "COCO 1K: mean over 5 folds of 1000 images of the 5K test set", (5000, 25000), 5, 5, "coco"),
    Protocol("coco5k", "COCO 5K test set", (5000, 25000), 5, 1, "coco"),
    Protocol("f30k", "Flickr30K 1K test set", (1000, 5000), 5, 1, "f30k"),
    Protocol("plain", "any N images x c captions per image"),
    Protocol("cub", "CUB Captions: class-level relevance, R-Precision and R@K", class_level=True,
             rerank_dataset="cub"),
    Protocol("eccv", "ECCV Caption positives on the COCO 5K test set: mAP@R, R-Precision, R@1 beside COCO 5K R@K",
             (5000, 25000), 5, 1, "coco", extended="eccv"),
    Protocol("cxc", "CxC positives on the COCO 5K test set: R@1/5/10 beside COCO 5K R@K", (5000, 25000), 5, 1,
             "coco", extended="cxc"),
)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise XmrError(f"unknown protocol {name!r}; choose one of: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def _check_shape(p: Protocol, n: int, m: int, c: int) -> None:
    if p.captions_per_image is not None and c != p.captions_per_image:
        raise XmrError(f"protocol {p.name} has {p.captions_per_image} captions per image, got "
                       f"captions-per-image {c}")
    if p.shape is not None and (n, m) != p.shape:
        raise XmrError(f"protocol {p.name} needs a {p.shape[0]} x {p.shape[1]} matrix (images x captions), "
                       f"got {n} x {m}")
    check_grouping(n, m, c)


def _fold_slices(p: Protocol, n: int, m: int) -> list[tuple[slice, slice]]:
    fi, fc = n // p.folds, m // p.folds
    return [(slice(f * fi, (f + 1) * fi), slice(f * fc, (f + 1) * fc)) for f in range(p.folds)]


def evaluate_sims(sims, protocol: str = "plain", captions_per_image: int = 5, rerank: str | None = None,
                  rerank_params: Mapping[str, Any] | None = None, *, ties: str = "pessimistic",
                  image_labels=None, caption_labels=None, rerank_defaults: str | None = None,
                  rerank_rows: Mapping[str, Any] | None = None, device: str | torch.device | None = None,
                  block_bytes: int = DEFAULT_BLOCK_BYTES, timing: bool = False,
                  subsets: Mapping[str, Mapping[str, Any]] | None = None,
                  keep_ranks: bool = False, positives: ExtendedPositives | None = None) -> dict[str, Any]:
    """Metrics of a similarity matrix (rows = images, columns = captions) under ``protocol``.

    Returns ``{"i2t": {r1, r5, r10, medr, meanr}, "t2i": {...}, "rsum", "protocol", "ties", "rerank",
    "rerank_params", "n_images", "n_captions", "captions_per_image"}``, plus ``"folds"`` (per-fold dicts) for
    coco1k. For ``cub`` each direction holds ``{r_precision, r1, r5, r10}`` and there is no rsum; labels come from
    ``image_labels`` (N,) and ``caption_labels`` (M,) (default: each image's label repeated for its
    ``captions_per_image`` captions).

    ``rerank`` names a re-ranker (:mod:`xmr.rerank`); ``rerank_params`` override the defaults of the
    ``rerank_defaults`` dataset row (default: the protocol's dataset, e.g. coco for coco1k/coco5k) of
    ``rerank_rows`` (``config/rerank/<name>.yaml`` as read by the caller; none: the code defaults).
    ``timing=True`` adds ``"timing_s"`` (re-rank preparation and ranking wall times).

    ``subsets`` (``{name: {"images": bool (N,), "captions": bool (M,)}}``, e.g. a split's ``extra['subsets']``)
    adds ``"subsets": {name: {"i2t", "t2i", "rsum", "n_images", "n_captions"}}``: the same ranks (whole gallery,
    same re-ranking) averaged over the subset's image queries and caption queries only.

    ``keep_ranks=True`` adds ``"query_ranks": {"i2t": (N,), "t2i": (M,)}``: each query's 0-based rank of its first
    positive (within its fold), the per-query record that the benchmark's query-level test reads.
    """
    p = get_protocol(protocol)
    check_ties(ties)
    a = check_matrix(sims, device)
    n, m = a.shape
    c = int(captions_per_image)
    if c < 1:  # every protocol divides by it (cub too, for its default caption labels)
        raise XmrError(f"captions-per-image must be >= 1, got {c}")

    spec = params = None
    if rerank not in (None, "", "none"):
        spec = RERANKERS.get(rerank)
        params = resolve_params(rerank, rerank_params, rerank_defaults or p.rerank_dataset, rerank_rows)
    elif rerank_params:
        raise XmrError("re-ranker parameters given without a re-ranker (--rerank)")

    head: dict[str, Any] = {"protocol": p.name, "ties": ties, "n_images": n, "n_captions": m,
                            "rerank": spec.name if spec else "none",
                            "rerank_params": describe_params(params) if params else {}}
    clock = {"rerank": 0.0, "ranking": 0.0}

    def rescoring(sub, rows: slice | None, cols: slice | None, cpi: int | None) -> Rescoring:
        if spec is None:
            return Rescoring(sub, block_bytes)
        if not (spec.numpy or is_tensor(sub)):
            sub = torch.as_tensor(sub)  # a view: this re-ranker computes in torch
        t0 = time.perf_counter()
        ctx = RerankContext(captions_per_image=cpi, rows=rows, cols=cols, block_bytes=block_bytes)
        out = spec.prepare(sub, params, ctx)
        clock["rerank"] += time.perf_counter() - t0
        return out

    if positives is not None and (p.folds > 1 or p.class_level):
        raise XmrError(f"protocol {p.name} has its own relevance; extended positives apply to single-fold protocols "
                       "(coco5k, f30k, plain, eccv, cxc)")
    if p.class_level:
        a = a if is_tensor(a) else torch.as_tensor(a)  # class-level ranking runs in torch (ranks.label_ranks)
        result = _evaluate_classes(a, image_labels, caption_labels, c, ties, rescoring, clock)
        result = {**head, **result}
    else:
        _check_shape(p, n, m, c)
        head["captions_per_image"] = c
        masks = _subset_masks(subsets, n, m)
        folds, kept = [], []
        if p.extended and (positives is None or positives.source != SOURCE_OF[p.extended]):
            raise XmrError(f"protocol {p.name} scores the {SOURCE_OF[p.extended]} positives: pass positives="
                           f"xmr.data.coco_positives.coco_positives({p.extended!r}) (what xmr evaluate and xmr test "
                           "do)")
        if positives is not None:
            positives.check(n, m)
        for rows, cols in _fold_slices(p, n, m):
            sc = rescoring(a[rows, cols], rows, cols, c)
            t0 = time.perf_counter()
            ranks_i2t, ranks_t2i = grouped_ranks(sc, c, ties)
            i2t, t2i = recall_metrics(ranks_i2t), recall_metrics(ranks_t2i)
            clock["ranking"] += time.perf_counter() - t0
            if keep_ranks:
                kept.append((np.asarray(ranks_i2t), np.asarray(ranks_t2i)))
            fold = {"i2t": i2t, "t2i": t2i, "rsum": rsum(i2t, t2i)}
            if masks:
                fold["subsets"] = {name: _subset_metrics(ranks_i2t, ranks_t2i, im[rows], cm[cols])
                                   for name, (im, cm) in masks.items()}
            folds.append(fold)
        result = {**head, **(mean_of(folds) if p.folds > 1 else folds[0])}
        if p.folds > 1:
            result["folds"] = folds
        if positives is not None:
            t0 = time.perf_counter()
            if p.extended == "cxc":
                result["cxc"] = recall_at_k(sc, positives, ties)
            else:
                ext = extended_metrics(sc, positives, ties, masks or None)
                for name, sub in ext.pop("subsets", {}).items():
                    result["subsets"][name]["extended"] = sub
                result["extended"] = ext
            clock["ranking"] += time.perf_counter() - t0
        if keep_ranks:
            result["query_ranks"] = {"i2t": np.concatenate([k[0] for k in kept]).astype(np.int32),
                                     "t2i": np.concatenate([k[1] for k in kept]).astype(np.int32)}
    if timing:
        result["timing_s"] = clock
    return result


def _subset_masks(subsets: Mapping[str, Mapping[str, Any]] | None, n: int,
                  m: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for name, sub in (subsets or {}).items():
        im = np.asarray(sub.get("images", np.zeros(n, bool)), dtype=bool).reshape(-1)
        cm = np.asarray(sub.get("captions", np.zeros(m, bool)), dtype=bool).reshape(-1)
        if im.shape != (n,) or cm.shape != (m,):
            raise XmrError(f"subset {name!r}: masks of {im.size} images / {cm.size} captions for a {n} x {m} matrix")
        if not im.any() and not cm.any():
            raise XmrError(f"subset {name!r} is empty")
        out[name] = (im, cm)
    return out


def _subset_metrics(ranks_i2t: np.ndarray, ranks_t2i: np.ndarray, im: np.ndarray, cm: np.ndarray) -> dict:
    """Recalls over a subset's queries; a direction with no query in the subset reports NaN (and so does RSUM)."""
    nan = {k: float("nan") for k in ("r1", "r5", "r10", "medr", "meanr")}
    i2t = recall_metrics(ranks_i2t[im]) if im.any() else nan
    t2i = recall_metrics(ranks_t2i[cm]) if cm.any() else nan
    return {"i2t": i2t, "t2i": t2i, "rsum": rsum(i2t, t2i), "n_images": int(im.sum()), "n_captions": int(cm.sum())}


def _evaluate_classes(a: torch.Tensor, image_labels, caption_labels, c: int, ties: str, rescoring,
                      clock: dict) -> dict[str, Any]:
    n, m = a.shape
    if image_labels is None:
        raise XmrError("protocol cub needs image class labels (--image-labels)")
    li = np.asarray(image_labels).reshape(-1)
    if li.shape[0] != n:
        raise XmrError(f"{li.shape[0]} image labels for a matrix with {n} image rows")
    cpi = c if m == c * n else None
    if caption_labels is None:
        if m % c:
            raise XmrError(f"caption count {m} is not divisible by captions-per-image {c}; "
                           "give caption labels (--caption-labels)")
        if cpi is None:
            raise XmrError(f"{m} captions with {c} per image make {m // c} images, but the matrix has {n} image "
                           "rows; give caption labels (--caption-labels) or the right --captions-per-image")
        lc = np.repeat(li, c)
    else:
        lc = np.asarray(caption_labels).reshape(-1)
        if lc.shape[0] != m:
            raise XmrError(f"{lc.shape[0]} caption labels for a matrix with {m} caption columns")
    # any label type (ints, strings): compare integer codes
    codes = np.unique(np.concatenate([li.astype(str) if li.dtype.kind in "OUS" else li,
                                      lc.astype(str) if lc.dtype.kind in "OUS" else lc]), return_inverse=True)[1]
    li, lc = codes[:n], codes[n:]
    sc = rescoring(a, None, None, cpi)
    t0 = time.perf_counter()
    i2t_rank, i2t_rp, t2i_rank, t2i_rp = label_ranks(sc, li, lc, ties)
    clock["ranking"] += time.perf_counter() - t0
    return {"i2t": class_metrics(i2t_rank, i2t_rp), "t2i": class_metrics(t2i_rank, t2i_rp),
            "captions_per_image": cpi}
