"""Cross-domain similarity local scaling (CSLS; Conneau et al., ICLR 2018, "Word translation without parallel data").

    CSLS[i, j] = 2·A[i, j] - r_img[i] - r_cap[j]
    r_img[i] = mean of the k largest A[i, :]   (image i's k nearest captions)
    r_cap[j] = mean of the k largest A[:, j]   (caption j's k nearest images)

One matrix serves both directions (the query's own term does not change its ranking but is kept so the values
are CSLS). k = 10 as in the paper; k is capped at the axis length.
"""

from __future__ import annotations

import math


from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring, iter_blocks


def topk_means(sims: torch.Tensor, k: int, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of the k largest entries of every row (N,) and of every column (M,), in one pass over row blocks."""
    n, m = sims.shape
    kr, kc = min(k, m), min(k, n)
    row = torch.empty(n, device=sims.device)
    col_top = torch.full((kc, m), -math.inf, device=sims.device)
    for rows in iter_blocks(n, m * 4 * 3, block_bytes):
        s = sims[rows]
        row[rows] = s.topk(kr, dim=1).values.mean(1)
        block_top = s.topk(min(kc, s.shape[0]), dim=0).values
        col_top = torch.cat([col_top, block_top], dim=0).topk(kc, dim=0).values
    return row, col_top.mean(0)


class CslsRescoring(Rescoring):
    def __init__(self, sims: torch.Tensor, k: int, block_bytes: int) -> None:
        super().__init__(sims, block_bytes)
        self.r_img, self.r_cap = topk_means(sims, k, block_bytes)

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        return 2.0 * self.sims[rows, cols] - self.r_img[rows, None] - self.r_cap[None, cols]

    t2i_block = i2t_block  # one CSLS matrix serves both directions


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    if p["k"] < 1:
        raise XmrError(f"re-ranker 'csls': k must be >= 1, got {p['k']}")
    return CslsRescoring(sims, p["k"], ctx.block_bytes)


RERANKERS.register("csls")(RerankerSpec(
    name="csls",
    summary="CSLS: 2·sim minus the mean top-k similarity of the image and of the caption (hubness correction)",
    defaults={"k": 10},
    prepare=_prepare,
    source="Conneau et al., Word Translation Without Parallel Data, ICLR 2018 (k = 10)",
))
