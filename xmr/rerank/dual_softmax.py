"""Dual softmax (DSL at inference; Cheng et al., CAMoE, arXiv 2109.04290).

The similarity is multiplied by a prior, the softmax of the scaled similarities over the *queries*:

    image -> text: R[i, j] = A[i, j] · exp(τ·A[i, j]) / Σ_l exp(τ·A[l, j])   (prior over all query images)
    text -> image: R[i, j] = A[i, j] · exp(τ·A[i, j]) / Σ_l exp(τ·A[i, l])   (prior over all query captions)

Reference code (CLIP4Clip/CAMoE descendants) applies ``sim * softmax(sim / 1, dim=0) * len(sim)`` to CLIP
logits, i.e. cosine x 100: ``scale`` τ = 100 on cosine similarities is that setting (the constant factor
``len(sim)`` does not change rankings and is omitted). Note that a negative similarity is pulled towards 0 by a
small prior, as in the reference.
"""

from __future__ import annotations

import torch

from xmr.errors import XmrError
from xmr.rerank import RERANKERS, RerankContext, RerankerSpec, Rescoring
from xmr.rerank.fast import lse_stats


class DualSoftmaxRescoring(Rescoring):
    def __init__(self, sims: torch.Tensor, scale: float, block_bytes: int) -> None:
        super().__init__(sims, block_bytes)
        self.scale = scale
        self.col_lse, self.row_lse = lse_stats(sims, scale, scale, block_bytes)

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        return s * torch.exp(s * self.scale - self.col_lse[None, cols])

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        return s * torch.exp(s * self.scale - self.row_lse[rows, None])


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    if not p["scale"] > 0:
        raise XmrError(f"re-ranker 'dsl': scale must be > 0, got {p['scale']}")
    return DualSoftmaxRescoring(sims, p["scale"], ctx.block_bytes)


RERANKERS.register("dsl")(RerankerSpec(
    name="dsl",
    summary="dual softmax: similarity times its softmax prior over all test queries",
    defaults={"scale": 100.0},
    prepare=_prepare,
    source="Cheng et al., Improving Video-Text Retrieval by Multi-Stream Corpus Alignment and Dual Softmax Loss, "
           "arXiv 2109.04290 (CAMoE); inference form as in CLIP4Clip-based code",
))
