"""How far apart a set method keeps an image's K sub-embeddings (DVSE Fig. 6), beside the similarity spread
(xmr/evaluation/spread.py):

- ``correlation_matrix(x)``: the (K, K) matrix of cosines (or Pearson correlations) between an image's
  sub-embeddings, averaged over images; ``mean_off_diagonal`` of it is the one number Fig. 6 shows as a picture.
- ``slot_usage(image_sets, text, caption_image)``: over the positive (image, caption) pairs, how often each slot k
  gives the highest cosine with the caption (the slot a max-over-slots score uses; the first of tied slots), and the entropy of that
  distribution (bits; normalised by log2 K: 1 = every slot equally used, 0 = one slot wins every pair).
- ``circular_variance(x)``: DivE §4.6 (Table 3 right): for each set S of unit vectors, 1 − ‖(1/|S|) Σ_{x∈S} x‖₂
  (0 when every element points the same way: a collapsed set; 1 when they cancel out), averaged over the sets.
  DivE reports its natural log, log(Var.).
- ``set_statistics(...)``: all of them, for the final sub-embeddings and for the residuals (DVSE/PVSE's v̂, DivE's slots),
  plus, for DVSE, the mean norms of h_V(z) and v̂^k before the LayerNorm.

``xmr score`` computes them for every set method's scored split (``xmr.inference.model.compute_set_statistics``), stores
them beside the gallery cache (``xmr.run.gallery_cache.write_set_statistics``), and ``xmr test`` / ``xmr evaluate`` copy
them into the results file (``set_statistics``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from xmr.core.errors import XmrError

MEASURES = ("cosine", "pearson")
#: set similarities that compare an image's slots with the caption by cosine: slot usage means something there
#: (PCME's match probability averages over samples, so which sample "wins" is noise)
SLOT_MEASURES = ("max", "mean", "chamfer", "smooth_chamfer")
TIE_TOLERANCE = 1e-9  # cosines closer than this count as tied
COLLAPSED = 1e-12  # a circular variance this small is 0 up to float64 rounding (every element the same direction)


def correlation_sums(x: torch.Tensor, measure: str = "cosine", absolute: bool = False) -> torch.Tensor:
    """Sum over the images of ``x`` (N, K, D) of their (K, K) correlation matrices, in float64 (divide by N for the
    mean; summing lets a caller go batch by batch). ``pearson`` centres each vector over its D dimensions first;
    ``absolute`` sums |correlation|."""
    if measure not in MEASURES:
        raise XmrError(f"measure {measure!r}: choose one of {', '.join(MEASURES)}")
    x = x.double()
    if measure == "pearson":
        x = x - x.mean(dim=-1, keepdim=True)
    x = torch.nn.functional.normalize(x, dim=-1)
    corr = x @ x.transpose(1, 2)
    return (corr.abs() if absolute else corr).sum(0)


def correlation_matrix(x: torch.Tensor, measure: str = "cosine", absolute: bool = False) -> np.ndarray:
    """(K, K): the correlation of sub-embeddings k and l, averaged over the N images of ``x`` (N, K, D)."""
    if x.ndim != 3 or not x.shape[0]:
        raise XmrError(f"correlation_matrix needs image sets (N >= 1, K, D), got shape {tuple(x.shape)}")
    return (correlation_sums(x, measure, absolute) / x.shape[0]).numpy()


def mean_off_diagonal(matrix: np.ndarray) -> float:
    """Mean of the K(K-1) off-diagonal entries of a (K, K) matrix; nan for K = 1."""
    m = np.asarray(matrix, dtype=float)
    off = m[~np.eye(len(m), dtype=bool)]
    return float(off.mean()) if off.size else float("nan")


def circular_variance(x: torch.Tensor) -> float:
    """DivE's circular variance of sets ``x`` (N, K, D): 1 − ‖mean of the K unit vectors‖₂ per set, averaged over
    the N sets (elements are L2-normalised first; a K = 1 set has 0)."""
    if x.ndim != 3 or not x.shape[0]:
        raise XmrError(f"circular_variance needs sets (N >= 1, K, D), got shape {tuple(x.shape)}")
    unit = torch.nn.functional.normalize(x.double(), dim=-1)
    return float((1 - unit.mean(dim=1).norm(dim=-1)).mean())


def _log(v: float) -> float | None:
    return math.log(v) if v > COLLAPSED else None  # a collapsed set (0 up to rounding): no log; JSON has no -inf


def slot_usage(image_sets: torch.Tensor, text: torch.Tensor, caption_image: list[int] | np.ndarray | torch.Tensor
               ) -> dict[str, Any]:
    """Which image slot gives the highest cosine with each positive caption.

    ``image_sets`` (N, K, D), ``text`` (M, D) or (M, L, D) (a caption set: the slot of the best (k, l) pair),
    ``caption_image`` (M,): the image of each caption. Returns ``counts`` and ``frequency`` per slot, ``entropy_bits``
    and ``entropy_normalised`` (entropy / log2 K; 0 for K = 1)."""
    img = torch.nn.functional.normalize(image_sets.double(), dim=-1)
    txt = torch.nn.functional.normalize(text.double(), dim=-1)
    owner = torch.as_tensor(np.asarray(caption_image), dtype=torch.long)
    if txt.ndim == 2:
        txt = txt[:, None, :]
    k = img.shape[1]
    cos = torch.einsum("mkd,mld->mkl", img[owner], txt).amax(dim=2)  # (M, K): each slot's best match
    # the first of the tied slots (DVSE's gated-off slots are all LN(h_V(z)): equal up to rounding)
    winner = (cos >= cos.amax(dim=1, keepdim=True) - TIE_TOLERANCE).to(torch.int8).argmax(dim=1)
    counts = torch.bincount(winner, minlength=k).tolist()
    total = sum(counts)
    freq = [c / total for c in counts] if total else [float("nan")] * k
    entropy = -sum(p * math.log2(p) for p in freq if p > 0) if total else float("nan")
    return {"counts": counts, "frequency": freq, "entropy_bits": entropy,
            "entropy_normalised": entropy / math.log2(k) if k > 1 else 0.0}


def set_statistics(embeddings: torch.Tensor, text: torch.Tensor | None = None,
                   caption_image: list[int] | np.ndarray | None = None, residuals: torch.Tensor | None = None,
                   global_norm: float | None = None, residual_norm: float | None = None) -> dict[str, Any]:
    """The record a results file keeps (``set_statistics``): ``k``; ``correlation`` (mean off-diagonal cosine of the
    final sub-embeddings, averaged over images), ``correlation_pearson``, ``matrix`` (the (K, K) cosine matrix),
    ``circular_variance`` and its natural log ``log_circular_variance`` (DivE Table 3 right); the same for the
    residuals when given (``residual_correlation``, ...); ``slot_usage`` when ``text`` is given, with
    ``caption_circular_variance`` when the captions are sets too (DivE's S^T);
    ``global_norm`` / ``residual_norm`` (mean ‖h_V(z)‖ and ‖v̂^k‖ before the LayerNorm) when given."""
    m = correlation_matrix(embeddings)
    out: dict[str, Any] = {"k": int(embeddings.shape[1]), "correlation": mean_off_diagonal(m),
                           "correlation_pearson": mean_off_diagonal(correlation_matrix(embeddings, "pearson")),
                           "matrix": m.round(6).tolist()}
    cv = circular_variance(embeddings)
    out |= {"circular_variance": cv, "log_circular_variance": _log(cv)}
    if residuals is not None:
        r = correlation_matrix(residuals)
        rcv = circular_variance(residuals)
        out |= {"residual_correlation": mean_off_diagonal(r),
                "residual_correlation_pearson": mean_off_diagonal(correlation_matrix(residuals, "pearson")),
                "residual_matrix": r.round(6).tolist(),
                "residual_circular_variance": rcv, "residual_log_circular_variance": _log(rcv)}
    if text is not None:
        if caption_image is None:
            raise XmrError("set_statistics: slot usage needs caption_image with the captions")
        out["slot_usage"] = slot_usage(embeddings, text, caption_image)
        if text.ndim == 3:
            tcv = circular_variance(text)
            out |= {"caption_circular_variance": tcv, "caption_log_circular_variance": _log(tcv)}
    if global_norm is not None:
        out["global_norm"] = float(global_norm)
    if residual_norm is not None:
        out["residual_norm"] = float(residual_norm)
    return out


def residual_key(image_outputs: dict) -> str | None:
    """The key of a set model's residuals in its ``image_outputs`` (DVSE/PVSE ``image_residuals``, DivE
    ``image_slots``), or None."""
    for key in ("image_residuals", "image_slots"):
        if image_outputs.get(key) is not None:
            return key
    return None


__all__ = ["MEASURES", "SLOT_MEASURES", "circular_variance", "correlation_matrix", "correlation_sums",
           "mean_off_diagonal", "residual_key", "set_statistics", "slot_usage"]
