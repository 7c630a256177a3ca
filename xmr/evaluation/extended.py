"""Retrieval metrics with extended positives: several relevant items per query (ECCV Caption, CxC, a dataset's own
extra positives such as synth's scene-checked ones), computed from tie-aware ranks, block by block.

For a query with ``R`` listed positives (``n_relevant``; a listed positive missing from the gallery counts in ``R``
and is never retrieved, as in the eccv-caption package) and 1-based positions ``P_1 < P_2 < ...`` of its positives
in the gallery sorted by decreasing score:

- mAP@R        = (1/R) · sum over k with P_k <= R of k / P_k   (Musgrave et al.; ECCV Caption's main metric)
- R-Precision  = #{k : P_k <= R} / R
- R@K          = 1 if P_1 <= K else 0

Each is averaged over the direction's queries and reported in percent, like R@K. Positions follow the evaluator's
tie policy (:mod:`xmr.evaluation.ranks`): ``pessimistic`` puts every tied irrelevant item before the tied relevant
ones, ``optimistic`` after them, ``index`` orders ties by gallery index. Among tied relevant items the order does
not change any metric. So under ``pessimistic`` a model that scores everything alike gets the lowest mAP@R, never
a free one.

Positions are counted, not sorted: the R-th largest score of each query row (a partition, not a sort) bounds the
items that can hold a position <= R, and each positive's position is the number of those ranked before it; all the
queries of a block at once (no loop over queries).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.lazy import is_tensor
from xmr.evaluation.metrics import RECALL_KS
from xmr.rerank import Rescoring

#: largest (queries x positives x gallery) boolean block compared at once
COMPARE_BYTES = 1 << 24


@dataclass(frozen=True)
class Positives:
    """The relevant gallery items of some queries of one direction.

    ``queries`` (Q,): query indices (image rows for image->text, caption columns for text->image); ``items`` (Q, P):
    gallery indices of each query's positives, padded with -1; ``n_relevant`` (Q,): R, the number of listed
    positives (at least the number of items given)."""

    queries: np.ndarray
    items: np.ndarray
    n_relevant: np.ndarray

    @classmethod
    def from_lists(cls, queries: Sequence[int], lists: Sequence[Sequence[int]],
                   n_relevant: Sequence[int] | None = None) -> "Positives":
        width = max((len(x) for x in lists), default=0)
        items = np.full((len(lists), max(width, 1)), -1, dtype=np.int64)
        for q, x in enumerate(lists):  # building the padded table; the metrics themselves are vectorised
            unique = sorted(set(int(v) for v in x))
            items[q, :len(unique)] = unique
        sizes = (items >= 0).sum(1)
        rel = sizes if n_relevant is None else np.asarray(n_relevant, dtype=np.int64)
        keep = rel > 0  # a query with no positive is no query (CxC lists none for 28 captions)
        return cls(np.asarray(queries, dtype=np.int64)[keep], items[keep], rel[keep])


@dataclass(frozen=True)
class ExtendedPositives:
    """Positives of both directions and the name of their source (``eccv_caption``, ``cxc``, ``synth_scenes``)."""

    source: str
    i2t: Positives
    t2i: Positives

    def check(self, n: int, m: int) -> None:
        for name, pos, size, gallery in (("image->text", self.i2t, n, m), ("text->image", self.t2i, m, n)):
            if pos.queries.size and (pos.queries.max() >= size or pos.items.max() >= gallery):
                raise XmrError(f"{self.source} positives ({name}) name item {int(max(pos.queries.max(), pos.items.max()))}"
                               f" beyond the {n} x {m} matrix; give positives made for this split")


def positives_from_caption_lists(caption_images: Sequence[Sequence[int]], n_images: int, source: str) -> ExtendedPositives:
    """Both directions from each caption's list of positive images (image rows): image i's positives are the
    captions that list it."""
    m = len(caption_images)
    lens = np.fromiter((len(x) for x in caption_images), dtype=np.int64, count=m)
    cap = np.repeat(np.arange(m), lens)
    img = np.concatenate([np.asarray(x, dtype=np.int64) for x in caption_images]) if m else np.zeros(0, np.int64)
    if img.size and (img.min() < 0 or img.max() >= n_images):
        raise XmrError(f"{source} positives name image row {int(img.max())} of a split with {n_images} images")
    order = np.lexsort((cap, img))
    bounds = np.searchsorted(img[order], np.arange(n_images + 1))
    by_image = [cap[order][bounds[i]:bounds[i + 1]] for i in range(n_images)]
    return ExtendedPositives(source, Positives.from_lists(range(n_images), by_image),
                             Positives.from_lists(range(m), caption_images))


def _as_numpy(block) -> np.ndarray:
    return block.detach().cpu().numpy() if is_tensor(block) else np.asarray(block)


def positive_positions(s: np.ndarray, items: np.ndarray, n_relevant: np.ndarray, ties: str) -> np.ndarray:
    """1-based positions, sorted ascending, of each query row's positives ``items`` (Q, P, -1 padded) in its row
    of ``s`` (Q, G) sorted by decreasing score under the tie policy ``ties``. Only positions up to the query's
    ``n_relevant`` (R) are exact, which is all mAP@R, R-Precision and R@1 read; later ones and padding are a
    large number."""
    q, p = items.shape
    g = s.shape[1]
    valid = items >= 0
    idx = np.where(valid, items, 0)
    ps = np.where(valid, np.take_along_axis(s, idx, 1), -np.inf)
    big = np.iinfo(np.int64).max
    if ties == "index":  # ties ordered by gallery index: count every item before each positive
        out = np.empty((q, p), dtype=np.int64)
        step = max(1, COMPARE_BYTES // max(1, p * g))
        gallery = np.arange(g)[None, None, :]
        for a in range(0, q, step):  # bounded memory: a few queries' comparisons at a time
            blk, thr = s[a:a + step, None, :], ps[a:a + step, :, None]
            out[a:a + step] = np.count_nonzero((blk > thr) | ((blk == thr) & (gallery < idx[a:a + step, :, None])), -1)
        pos = np.where(valid, out + 1, big)
        r = np.minimum(n_relevant, g)[:, None]
        return np.sort(np.where(pos <= r, pos, big), axis=1)
    # Only the top R items can hold a position <= R: the R-th largest score t bounds them. Items scoring above a
    # positive that scores above t are all among the top R values; for a positive tied with t, count the row.
    r = np.minimum(n_relevant, g)
    width = int(r.max())
    top = np.partition(s, g - width, axis=1)[:, g - width:]
    top = -np.sort(-top, axis=1)
    t = np.take_along_axis(top, (r - 1)[:, None], 1)
    inclusive = ties == "pessimistic"
    cmp = np.greater_equal if inclusive else np.greater
    n_all = np.count_nonzero(cmp(top[:, None, :], ps[:, :, None]), axis=-1)
    if inclusive and (valid & (ps == t)).any():
        n_all = np.where(ps == t, np.count_nonzero(s >= t, axis=1)[:, None], n_all)
    n_pos = np.count_nonzero(cmp(ps[:, None, :], ps[:, :, None]) & valid[:, None, :], axis=-1)
    before = n_all - n_pos  # irrelevant items ranked before each positive
    # positives by decreasing score: the k-th (0-based) also has the k positives before it
    order = np.argsort(-ps, axis=1, kind="stable")
    pos = np.take_along_axis(before, order, 1) + np.arange(p)[None, :] + 1
    keep = np.take_along_axis(valid & (ps >= t), order, 1) & (pos <= r[:, None])
    return np.sort(np.where(keep, pos, big), axis=1)


def first_positive_position(s: np.ndarray, items: np.ndarray, ties: str) -> np.ndarray:
    """0-based rank of each query's best-ranked positive (one pass over the row, as the 1-positive protocols)."""
    valid = items >= 0
    idx = np.where(valid, items, 0)
    ps = np.where(valid, np.take_along_axis(s, idx, 1), -np.inf)
    best = ps.max(1, keepdims=True)
    at_best = valid & (ps == best)
    if ties == "optimistic":
        return np.count_nonzero(s > best, axis=1)
    if ties == "pessimistic":
        return np.count_nonzero(s >= best, axis=1) - at_best.sum(1)
    first = np.where(at_best, idx, s.shape[1]).min(1, keepdims=True)
    return np.count_nonzero(s > best, axis=1) + np.count_nonzero((s == best) & (np.arange(s.shape[1]) < first), axis=1)


def _direction_blocks(sc: Rescoring, direction: str) -> Iterator[tuple[slice, Any]]:
    """(query slice, queries x gallery scores) over the whole matrix, in the rescoring's blocks."""
    if direction == "i2t":
        for rows in sc.row_blocks():
            yield rows, sc.i2t(rows)
    else:
        for cols in sc.col_blocks():
            yield cols, sc.t2i(cols).T


def query_scores(sc: Rescoring, pos: Positives, direction: str, ties: str, full: bool) -> dict[str, np.ndarray]:
    """Per-query numbers of one direction, in the order of ``pos.queries``: ``first`` (0-based rank of the first
    positive) and, with ``full``, ``map_at_r`` and ``r_precision`` (fractions)."""
    qn = pos.queries.size
    first = np.zeros(qn, np.int64)
    ap, rp = np.zeros(qn), np.zeros(qn)
    order = np.argsort(pos.queries, kind="stable")
    sorted_q = pos.queries[order]
    for span, block in _direction_blocks(sc, direction):
        lo, hi = np.searchsorted(sorted_q, [span.start, span.stop])
        if lo == hi:
            continue
        sel = order[lo:hi]
        scores = _as_numpy(block)
        local = pos.queries[sel] - span.start
        if not full:
            width = int((pos.items[sel] >= 0).sum(1).max())
            if 2 * local.size > scores.shape[0]:  # most of the block are queries: rank it in place, no copy
                table = np.full((scores.shape[0], max(width, 1)), -1, dtype=np.int64)
                table[local] = pos.items[sel, :max(width, 1)]
                first[sel] = first_positive_position(scores, table, ties)[local]
            else:
                first[sel] = first_positive_position(scores[local], pos.items[sel, :max(width, 1)], ties)
            continue
        s = scores[local]
        width = int((pos.items[sel] >= 0).sum(1).max())
        items = pos.items[sel, :max(width, 1)]
        where = positive_positions(s, items, pos.n_relevant[sel], ties)
        r = pos.n_relevant[sel][:, None]
        k = np.arange(1, where.shape[1] + 1)[None, :]
        hit = where <= r
        ap[sel] = (np.where(hit, k / np.where(hit, where, 1), 0.0)).sum(1) / r[:, 0]
        rp[sel] = hit.sum(1) / r[:, 0]
        first[sel] = where[:, 0] - 1
    out = {"first": first}
    if full:
        out |= {"map_at_r": ap, "r_precision": rp}
    return out


def summarize(per_query: dict[str, np.ndarray], keep: np.ndarray | None = None, recalls: Sequence[int] = (1,),
              full: bool = True) -> dict[str, float]:
    """Percent means over the queries (``keep``: a boolean mask over them; none kept gives NaN)."""
    keep = np.ones(per_query["first"].shape, bool) if keep is None else keep
    if not keep.any():
        return {k: float("nan") for k in ((("map_at_r", "r_precision") if full else ()) + tuple(f"r{x}" for x in recalls))}
    out = {}
    if full:
        out["map_at_r"] = 100.0 * float(per_query["map_at_r"][keep].mean())
        out["r_precision"] = 100.0 * float(per_query["r_precision"][keep].mean())
    for k in recalls:
        out[f"r{k}"] = 100.0 * float((per_query["first"][keep] < k).mean())
    return out


def extended_metrics(sc: Rescoring, positives: ExtendedPositives, ties: str,
                     subsets: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> dict[str, Any]:
    """ECCV Caption's metrics (mAP@R, R-Precision, R@1 per direction, percent) over ``positives``:
    ``{"positives": source, "i2t": {...}, "t2i": {...}}``; with ``subsets`` (name -> (image mask, caption mask)),
    also ``{"subsets": {name: same shape}}`` over the subset's queries."""
    per = {d: query_scores(sc, getattr(positives, d), d, ties, True) for d in ("i2t", "t2i")}
    out: dict[str, Any] = {"positives": positives.source, **{d: summarize(per[d]) for d in per}}
    if subsets:
        out["subsets"] = {}
        for name, (im, cm) in subsets.items():
            masks = {"i2t": im[positives.i2t.queries], "t2i": cm[positives.t2i.queries]}
            out["subsets"][name] = {"positives": positives.source, **{d: summarize(per[d], masks[d]) for d in per}}
    return out


def recall_at_k(sc: Rescoring, positives: ExtendedPositives, ties: str) -> dict[str, dict[str, float]]:
    """R@1/5/10 per direction (percent) with several positives per query: CxC's numbers."""
    return {d: summarize(query_scores(sc, getattr(positives, d), d, ties, False), recalls=RECALL_KS, full=False)
            for d in ("i2t", "t2i")}
