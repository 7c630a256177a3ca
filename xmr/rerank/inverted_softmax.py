"""Inverted softmax (Smith et al., ICLR 2017): normalise each gallery item's scores over all queries.

    image -> text: R[i, j] = β·A[i, j] - log Σ_l exp(β·A[l, j])   (caption j's scores over all query images)
    text -> image: R[i, j] = β·A[i, j] - log Σ_l exp(β·A[i, l])   (image i's scores over all query captions)

This is FR (:mod:`xmr.rerank.fast`) with γ1 = γ2 = λ1 = λ2 = β; it is transductive in the same way (the test
queries are the normalising set). β = 20 follows the QB-Norm code's default for inverted softmax.
"""

from __future__ import annotations

from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring
from xmr.rerank.fast import FastRescoring


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    if not p["beta"] > 0:
        raise XmrError(f"re-ranker 'isoftmax': beta must be > 0, got {p['beta']}")
    b = p["beta"]
    return FastRescoring(sims, b, b, b, b, "lse", False, ctx.block_bytes)


RERANKERS.register("isoftmax")(RerankerSpec(
    name="isoftmax",
    summary="inverted softmax: each gallery item's scores normalised over all test queries (temperature 1/beta)",
    defaults={"beta": 20.0},
    prepare=_prepare,
    source="Smith et al., Offline bilingual word vectors, orthogonal transformations and the inverted softmax, "
           "ICLR 2017; beta default from github.com/ioanacroi/qb-norm",
))
