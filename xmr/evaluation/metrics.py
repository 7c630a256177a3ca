"""Retrieval metrics from ranks, as defined by the VSE++/VSE∞ reference evaluation and PCME's CUB protocol.

Ranks are 0-based positions of the first relevant item (see :mod:`xmr.evaluation.ranks`):

- R@K   = 100 · fraction of queries with rank < K (percent)
- medr  = floor(median rank) + 1
- meanr = mean rank + 1
- RSUM  = i2t R@1 + R@5 + R@10 + t2i R@1 + R@5 + R@10
- R-Precision (CUB) = 100 · mean over queries of (relevant items among the top R) / R
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

RECALL_KS = (1, 5, 10)


def recall_metrics(ranks) -> dict[str, float]:
    """``{"r1", "r5", "r10", "medr", "meanr"}`` of 0-based ranks."""
    r = np.asarray(ranks, dtype=np.float64)
    out = {f"r{k}": 100.0 * float(np.mean(r < k)) for k in RECALL_KS}
    out["medr"] = float(np.floor(np.median(r)) + 1)
    out["meanr"] = float(r.mean() + 1)
    return out


def rsum(i2t: Mapping[str, float], t2i: Mapping[str, float]) -> float:
    return float(sum(d[f"r{k}"] for d in (i2t, t2i) for k in RECALL_KS))


def class_metrics(first_ranks, r_precisions) -> dict[str, float]:
    """CUB metrics of one direction: R-Precision and R@{1,5,10} (percent) with class-level relevance."""
    r = np.asarray(first_ranks, dtype=np.float64)
    out = {"r_precision": 100.0 * float(np.mean(r_precisions))}
    out.update({f"r{k}": 100.0 * float(np.mean(r < k)) for k in RECALL_KS})
    return out


def mean_of(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Plain mean of every number in a list of equally-shaped (nested) metric dicts: COCO-1K's fold average."""
    first = results[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, Mapping):
            out[key] = mean_of([r[key] for r in results])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(np.mean([r[key] for r in results]))
    return out


def saturated_recalls(metrics: dict, ks: tuple[int, ...] = (1, 5, 10)) -> str | None:
    """The R@K of one evaluation's ``metrics`` that are 100 by construction, because K reaches the gallery: text
    to image when K >= the images per fold (the one right image is always in the top K), image to text when
    K > captions per fold minus the image's own (one of its captions always is), e.g. ``t2i R@5, R@10 (5
    images)``; None when none is (or for the class-level protocols, whose right answers are many)."""
    if "rsum" not in metrics or not metrics.get("n_images") or not metrics.get("n_captions"):
        return None
    folds = len(metrics.get("folds") or ()) or 1
    images, captions = metrics["n_images"] // folds, metrics["n_captions"] // folds
    own = int(metrics.get("captions_per_image") or 1)
    parts = []
    for direction, reached, gallery in (("i2t", lambda k: k > captions - own, f"{captions} captions, {own} per image"),
                                        ("t2i", lambda k: k >= images, f"{images} images")):
        hit = [f"R@{k}" for k in ks if reached(k)]
        if hit:
            parts.append(f"{direction} {', '.join(hit)} ({gallery}{' per fold' if folds > 1 else ''})")
    return "; ".join(parts) or None


def saturation_note(saturated: str) -> str:
    """The one line that says so: ``note: R@K with K >= the gallery's size is 100 by construction: ...``."""
    return f"note: R@K with K >= the gallery's size is 100 by construction: {saturated}"
