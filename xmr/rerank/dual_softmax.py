"""Dual softmax (DSL at inference; Cheng et al., CAMoE, arXiv 2109.04290).

The similarity is multiplied by a prior, the softmax of the scaled similarities over the *queries*:

    image -> text: R[i, j] = A[i, j] · exp(τ·A[i, j]) / Σ_l exp(τ·A[l, j])   (prior over all query images)
    text -> image: R[i, j] = A[i, j] · exp(τ·A[i, j]) / Σ_l exp(τ·A[i, l])   (prior over all query captions)

Reference code (CLIP4Clip/CAMoE descendants) applies ``sim * softmax(sim / 1, dim=0) * len(sim)`` to CLIP
logits, i.e. cosine x 100: ``scale`` τ = 100 on cosine similarities is that setting (the constant factor
``len(sim)`` does not change rankings and is omitted). Note that a negative similarity is pulled towards 0 by a
small prior, as in the reference.

Log-probability matrices (PCME's ``log_match_prob``, L = log p): with ``scores=log_prob`` the re-ranker is DSL on
the probabilities p = e^L, returned as its log so that pairs whose p underflows stay ordered:

    image -> text: log R[i, j] = L[i, j] + τ·p[i, j] - log Σ_l exp(τ·p[l, j])      (and likewise text -> image)

With the default ``scores=similarity`` a matrix whose scores are all <= 0 is an error: the multiplicative prior
would *raise* the scores it should lower.
"""

from __future__ import annotations

import math


from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import (RERANKERS, RerankContext, RerankerSpec, Rescoring, iter_blocks, reject_nonpositive_scores,
                        require_log_probabilities)
from xmr.rerank.fast import lse_stats


def exp_lse_stats(log_p: torch.Tensor, scale: float, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``col[j] = LSE_i(scale·exp(L[i, j]))`` (M,) and ``row[i] = LSE_j(scale·exp(L[i, j]))`` (N,), one pass."""
    n, m = log_p.shape
    col = torch.full((m,), -math.inf, device=log_p.device)
    row = torch.empty(n, device=log_p.device)
    for rows in iter_blocks(n, m * 4 * 2, block_bytes):
        x = log_p[rows].exp().mul_(scale)  # in [0, scale]
        col = torch.logaddexp(col, torch.logsumexp(x, dim=0))
        row[rows] = torch.logsumexp(x, dim=1)
    return col, row


class DualSoftmaxRescoring(Rescoring):
    def __init__(self, sims: torch.Tensor, scale: float, block_bytes: int, log_prob: bool = False) -> None:
        super().__init__(sims, block_bytes)
        self.scale, self.log_prob = scale, log_prob
        if log_prob:
            self.col_lse, self.row_lse = exp_lse_stats(sims, scale, block_bytes)
        else:
            self.col_lse, self.row_lse = lse_stats(sims, scale, scale, block_bytes)

    def _score(self, s: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        if self.log_prob:  # log(p · prior) = L + τ·p - LSE
            return s + (s.exp() * self.scale - lse)
        return s * torch.exp(s * self.scale - lse)

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        return self._score(self.sims[rows, cols], self.col_lse[None, cols])

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        return self._score(self.sims[rows, cols], self.row_lse[rows, None])


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    if not p["scale"] > 0:
        raise XmrError(f"re-ranker 'dsl': scale must be > 0, got {p['scale']}")
    if p["scores"] == "log_prob":
        require_log_probabilities(sims, "dsl")
    else:
        reject_nonpositive_scores(sims, "dsl", "its multiplicative prior would raise the scores it should lower")
    return DualSoftmaxRescoring(sims, p["scale"], ctx.block_bytes, p["scores"] == "log_prob")


RERANKERS.register("dsl")(RerankerSpec(
    name="dsl",
    summary="dual softmax: similarity times its softmax prior over all test queries",
    defaults={"scale": 100.0, "scores": "similarity"},
    choices={"scores": ("similarity", "log_prob")},
    prepare=_prepare,
    source="Cheng et al., Improving Video-Text Retrieval by Multi-Stream Corpus Alignment and Dual Softmax Loss, "
           "arXiv 2109.04290 (CAMoE); inference form as in CLIP4Clip-based code",
))
