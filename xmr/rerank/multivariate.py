"""GaLR multivariate re-ranking (DVSE's "MR"; Yuan et al., TGRS 2022, ``postprocessing/rerank.py``,
``i2t_rerank_optim`` / ``t2i_rerank_optim``).

image -> text, for image i and its top-K1 captions c_0..c_{K1-1} (K1 = max(10, k), in similarity order p):

    score(i, c_p) = wp1 · A[i, c_p] / Σ_l A[l, c_p]          (linear normalisation over the caption's column)
                  + exp(-decay · (p + 1))                      (original position)
                  + wp2 · exp(-decay · (q_p + 1))              (q_p: c_p's place after re-sorting the K1 candidates
                                                                by the position of image i in c_p's ranking)

text -> image is the same on the transposed matrix (row sums, position of the caption in each candidate image's
ranking). The reference sets every entry outside the top K1 to 0 (``outside=zero``), which leaves later ranks
to the tie policy; ``outside=keep`` (default) places them below the K1 candidates in their original order, so
medr/meanr stay meaningful. Repository defaults: k = 30, wp1 = 0.30, wp2 = 1.1, decay = 0.05. The column
normalisation assumes positive similarities (a column sum near 0 makes it explode): it is a faithful port.

Log-probability matrices (PCME's ``log_match_prob``, L = log p): with ``scores=log_prob`` the normalised term is
that of the probabilities, p[i, c] / Σ_l p[l, c] = exp(L[i, c] - LSE_l L[l, c]), computed in log space (no
underflow); candidates and positions follow L, which orders like p. With the default ``scores=similarity`` a
matrix whose scores are all <= 0 is an error: the ratio of two negative numbers would rank the least similar
candidates first.
"""

from __future__ import annotations

import math


from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import (RERANKERS, RerankContext, RerankerSpec, Rescoring, iter_blocks, reject_nonpositive_scores,
                        require_log_probabilities)
from xmr.rerank.kreciprocal import (OverrideRescoring, caption_positions_in_images, column_candidates,
                                    image_positions_in_captions, row_candidates)


def _axis_sums(sims: torch.Tensor, block_bytes: int, log_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Column (M,) and row (N,) sums in float64; with ``log_prob`` the log-sum-exps (log of the sums of e^L)."""
    n, m = sims.shape
    if log_prob:
        col = torch.full((m,), -math.inf, dtype=torch.float64, device=sims.device)
    else:
        col = torch.zeros(m, dtype=torch.float64, device=sims.device)
    row = torch.empty(n, dtype=torch.float64, device=sims.device)
    for rows in iter_blocks(n, m * 8, block_bytes):
        s = sims[rows].double()
        if log_prob:
            col = torch.logaddexp(col, torch.logsumexp(s, dim=0))
            row[rows] = torch.logsumexp(s, dim=1)
        else:
            col += s.sum(0)
            row[rows] = s.sum(1)
    return col, row


def _normalised(vals: torch.Tensor, norm: torch.Tensor, log_prob: bool, what: str) -> torch.Tensor:
    """MR's linear normalisation A / Σ A of the candidates' values (float64); ``norm`` holds their axis sums
    (log-sum-exps with ``log_prob``)."""
    if log_prob:
        return torch.exp(vals.double() - norm)
    if bool((norm == 0).any()):
        raise XmrError(f"re-ranker 'mr': a candidate {what} sums to 0; MR's linear normalisation needs non-zero "
                       "(positive) similarity sums")
    return vals.double() / norm


def _scores(ratio: torch.Tensor, rev: torch.Tensor, p: dict) -> torch.Tensor:
    """Multivariate scores of candidates (queries, K1) in their similarity order; ``ratio``: normalised values."""
    k1 = ratio.shape[1]
    steps = torch.arange(1, k1 + 1, device=ratio.device, dtype=torch.float64)
    q = torch.empty_like(rev)
    q.scatter_(1, torch.sort(rev, dim=1, stable=True).indices, torch.arange(k1, device=rev.device).expand_as(rev))
    s = p["wp1"] * ratio + torch.exp(-p["decay"] * steps)[None, :] \
        + p["wp2"] * torch.exp(-p["decay"] * (q.double() + 1.0))
    return s.float()


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    n, m = sims.shape
    if p["k"] < 1:
        raise XmrError(f"re-ranker 'mr': k must be >= 1, got {p['k']}")
    log_prob = p["scores"] == "log_prob"
    if log_prob:
        require_log_probabilities(sims, "mr")
    else:
        reject_nonpositive_scores(sims, "mr", "its linear normalisation A / Σ A of negative scores would rank the "
                                              "least similar candidates first")
    bb = ctx.block_bytes
    col_sum, row_sum = _axis_sums(sims, bb, log_prob)

    k1 = min(max(10, p["k"]), m)
    vals, cand = row_candidates(sims, k1, bb)
    ratio = _normalised(vals, col_sum[cand], log_prob, "caption's column")
    i2t_val = _scores(ratio, image_positions_in_captions(sims, cand, bb), p)

    k2 = min(max(10, p["k"]), n)
    vals_t, cand_t = column_candidates(sims, k2, bb)
    ratio_t = _normalised(vals_t, row_sum[cand_t], log_prob, "image's row")
    t2i_val = _scores(ratio_t, caption_positions_in_images(sims, cand_t, bb), p)

    if p["outside"] == "zero":
        def i2t_base(s, rows, cols):
            return torch.zeros_like(s)

        def t2i_base(s, rows, cols):
            return torch.zeros_like(s)
    else:
        # keep the original order, strictly below the lowest re-ranked candidate of the row / column
        row_floor = i2t_val.amin(1) - 1.0 - vals[:, 0]
        col_floor = t2i_val.amin(1) - 1.0 - vals_t[:, 0]

        def i2t_base(s, rows, cols):
            return s + row_floor[rows, None]

        def t2i_base(s, rows, cols):
            return s + col_floor[None, cols]

    return OverrideRescoring(sims, cand, i2t_val, cand_t.T.contiguous(), t2i_val.T.contiguous(), bb,
                             i2t_base, t2i_base)


RERANKERS.register("mr")(RerankerSpec(
    name="mr",
    summary="GaLR multivariate re-ranking of the top-K1 candidates (K1 = max(10, k))",
    defaults={"k": 30, "wp1": 0.30, "wp2": 1.1, "decay": 0.05, "outside": "keep", "scores": "similarity"},
    choices={"outside": ("keep", "zero"), "scores": ("similarity", "log_prob")},
    prepare=_prepare,
    source="Yuan et al., Remote Sensing Cross-Modal Text-Image Retrieval Based on Global and Local Information, "
           "TGRS 2022; github.com/xiaoyuan1996/GaLR postprocessing/rerank.py (K=30, Wp1=0.30, Wp2=1.1)",
))
