"""MTFN-RR cross-modal k-reciprocal re-ranking (DVSE's "RR"; Wang et al., ACM MM 2019, ``rerank.py``).

image -> text, for image i: take its top-``k_i2t`` captions; for each candidate caption j find the position of
image i in caption j's own ranking of all images (the reverse query); re-sort the candidates by that position
(stable: equal positions keep their similarity order). Captions beyond the top ``k_i2t`` keep their order.

text -> image, for caption j: the same with its top-``k_t2i`` images and the position of caption j in each
candidate image's ranking of all captions. MTFN-RR's ``t2i_rerank`` instead takes the best position of any of
the five captions of j's ground-truth image (``i//5*5 + k``), i.e. it uses the test set's grouping inside the
re-ranker; that is ``t2i_gt_groups=true`` here (default false; results record the value).

The result is an ordering; as scores, the re-sorted top-k entries of a row (column) are lifted above the row's
(column's) maximum in their new order and every other entry keeps its similarity. Orders are exact and stable
(ties by lower index), where the reference uses NumPy's unstable ``argsort``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring, iter_blocks


def stable_topk(s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of each row of ``s`` in descending order, ties broken by lower column index (exactly the first
    k of a stable descending sort, without sorting whole rows). Returns ``(values, indices)``, each (rows, k)."""
    v, idx = s.topk(k, dim=1)
    kth = v[:, -1:]
    # rows where more entries tie at the k-th value than fit: topk's choice among them is arbitrary
    ambiguous = (s >= kth).sum(1, dtype=torch.int32) > k
    if bool(ambiguous.any()):
        rows = ambiguous.nonzero()[:, 0]
        sa, kth_a = s[rows], kth[rows]
        above, at = sa > kth_a, sa == kth_a
        need = k - above.sum(1, keepdim=True)
        take = above | (at & (at.cumsum(1) <= need))
        idx = idx.clone()
        idx[rows] = take.nonzero()[:, 1].view(-1, k)  # row-major: ascending column index within each row
    idx = torch.sort(idx, dim=1).values  # ascending index, then a stable sort by value keeps index order on ties
    vals = s.gather(1, idx)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), idx.gather(1, order)


def positions_in_rows(sims: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """Position of entry (rows[p], cols[p]) within its row sorted in descending, stable order (ties: lower column
    index first): ``#{c: A[r, c] > A[r, j]} + #{c < j: A[r, c] == A[r, j]}``.

    Sorts each row once (NumPy's vectorised sort, several times faster than torch.sort on CPU) and binary-searches
    every pair's value in it (for column positions pass ``sims.T``)."""
    n, m = sims.shape
    out = np.empty(rows.numel(), dtype=np.int64)
    if rows.numel() == 0:
        return torch.from_numpy(out).to(sims.device)
    order = torch.argsort(rows, stable=True).cpu().numpy()
    c_all = cols.cpu().numpy()
    r_sorted = rows.cpu().numpy()[order]
    for blk in iter_blocks(n, m * 12, block_bytes):
        lo, hi = np.searchsorted(r_sorted, [blk.start, blk.stop])
        if lo == hi:
            continue
        block = sims[blk].cpu().numpy()
        ordered = np.sort(block, axis=1)
        sel = order[lo:hi]
        bounds = np.searchsorted(r_sorted[lo:hi], np.arange(blk.start, blk.stop + 1))
        for r in range(blk.stop - blk.start):
            a, b = bounds[r], bounds[r + 1]
            if a == b:
                continue
            p = sel[a:b]
            row, c = block[r], c_all[p]
            v = row[c]
            le = np.searchsorted(ordered[r], v, side="right")
            pos = m - le
            tied = np.nonzero(le - np.searchsorted(ordered[r], v, side="left") > 1)[0]
            for t in tied:  # other entries equal to v come first when their column index is lower
                pos[t] += int(np.count_nonzero(row[:c[t]] == v[t]))
            out[p] = pos
    return torch.from_numpy(out).to(sims.device)


def _copy(s: torch.Tensor) -> torch.Tensor:
    """A private copy of a block (NumPy's copy is the cheaper one on CPU)."""
    if s.device.type == "cpu":
        return torch.from_numpy(s.detach().numpy().copy())
    return s.clone()


class OverrideRescoring(Rescoring):
    """Scores = a base (the similarities unless given) with, per row for i2t and per column for t2i, a few
    entries replaced: ``i2t_idx/i2t_val`` are (N, k) column indices/values, ``t2i_idx/t2i_val`` (k, M) row ones.
    ``i2t_base(s, rows, cols)`` / ``t2i_base`` map a block of similarities to base scores (a new tensor)."""

    def __init__(self, sims: torch.Tensor, i2t_idx: torch.Tensor, i2t_val: torch.Tensor, t2i_idx: torch.Tensor,
                 t2i_val: torch.Tensor, block_bytes: int,
                 i2t_base: Callable[[torch.Tensor, slice, slice], torch.Tensor] | None = None,
                 t2i_base: Callable[[torch.Tensor, slice, slice], torch.Tensor] | None = None) -> None:
        super().__init__(sims, block_bytes)
        self.i2t_idx, self.i2t_val, self.t2i_idx, self.t2i_val = i2t_idx, i2t_val, t2i_idx, t2i_val
        self.i2t_base, self.t2i_base = i2t_base, t2i_base
        # the t2i overrides as (row, col, value) sorted by row, for blocks of rows (the evaluator's access pattern)
        k, m = t2i_idx.shape
        rows = t2i_idx.reshape(-1)
        order = torch.argsort(rows, stable=True)
        self._t2i_rows = rows[order]
        self._t2i_cols = torch.arange(m, device=sims.device).repeat(k)[order]
        self._t2i_vals = t2i_val.reshape(-1)[order]

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        out = self.i2t_base(s, rows, cols) if self.i2t_base else _copy(s)
        idx, val = self.i2t_idx[rows], self.i2t_val[rows]
        if cols.start == 0 and cols.stop == self.sims.shape[1]:
            return out.scatter_(1, idx, val)
        sel = (idx >= cols.start) & (idx < cols.stop)
        local_rows = torch.arange(idx.shape[0], device=s.device)[:, None].expand_as(idx)
        out[local_rows[sel], idx[sel] - cols.start] = val[sel]
        return out

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        out = self.t2i_base(s, rows, cols) if self.t2i_base else _copy(s)
        if rows.start == 0 and rows.stop == self.sims.shape[0]:
            return out.scatter_(0, self.t2i_idx[:, cols], self.t2i_val[:, cols])
        lo = int(torch.searchsorted(self._t2i_rows, rows.start))
        hi = int(torch.searchsorted(self._t2i_rows, rows.stop))
        r, c, v = self._t2i_rows[lo:hi], self._t2i_cols[lo:hi], self._t2i_vals[lo:hi]
        keep = (c >= cols.start) & (c < cols.stop)
        out[r[keep] - rows.start, c[keep] - cols.start] = v[keep]
        return out


def row_candidates(sims: torch.Tensor, k: int, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable top-k captions of every image: values and indices (N, k)."""
    n, m = sims.shape
    vals = torch.empty(n, k, device=sims.device)
    idx = torch.empty(n, k, dtype=torch.long, device=sims.device)
    for rows in iter_blocks(n, m * 16, block_bytes):
        vals[rows], idx[rows] = stable_topk(sims[rows], k)
    return vals, idx


def column_candidates(sims: torch.Tensor, k: int, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable top-k images of every caption: values and indices (M, k) (one row per caption)."""
    n, m = sims.shape
    vals = torch.empty(m, k, device=sims.device)
    idx = torch.empty(m, k, dtype=torch.long, device=sims.device)
    for cols in iter_blocks(m, n * 16, block_bytes):
        vals[cols], idx[cols] = stable_topk(sims[:, cols].T, k)
    return vals, idx


def image_positions_in_captions(sims: torch.Tensor, cand: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """For image candidates ``cand`` (N, k) of captions: position of image i in caption cand[i, p]'s ranking."""
    n, k = cand.shape
    images = torch.arange(n, device=sims.device).repeat_interleave(k)
    # the columns of A are the rows of A.T: sorting them is cheaper than counting per pair
    return positions_in_rows(sims.T, cand.reshape(-1), images, block_bytes).view(n, k)


def caption_positions_in_images(sims: torch.Tensor, cand: torch.Tensor, block_bytes: int,
                                groups: int | None = None) -> torch.Tensor:
    """For image candidates ``cand`` (M, k) of each caption j: position of caption j in image cand[j, p]'s
    ranking; with ``groups=c``, the best position of any caption of j's group ``j//c*c .. j//c*c + c-1``."""
    m, k = cand.shape
    caps = torch.arange(m, device=sims.device)
    if groups is None:
        return positions_in_rows(sims, cand.reshape(-1), caps.repeat_interleave(k), block_bytes).view(m, k)
    sib = (caps // groups * groups)[:, None] + torch.arange(groups, device=sims.device)[None, :]  # (m, c)
    lines = cand[:, :, None].expand(m, k, groups).reshape(-1)
    items = sib[:, None, :].expand(m, k, groups).reshape(-1)
    return positions_in_rows(sims, lines, items, block_bytes).view(m, k, groups).amin(dim=2)


def _lift(top: torch.Tensor, k: int) -> torch.Tensor:
    """Scores k, k-1, ..., 1 steps above ``top`` (per row), each step at least 1: distinct and above any entry."""
    unit = top.abs().clamp(min=1.0)
    steps = torch.arange(k, 0, -1, device=top.device, dtype=top.dtype)
    return top[:, None] + steps[None, :] * unit[:, None]


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    n, m = sims.shape
    if p["k_i2t"] < 1 or p["k_t2i"] < 1:
        raise XmrError(f"re-ranker 'rr': k_i2t and k_t2i must be >= 1, got {p['k_i2t']}, {p['k_t2i']}")
    groups = None
    if p["t2i_gt_groups"]:
        c = ctx.captions_per_image
        if not c or m != c * n:
            raise XmrError("re-ranker 'rr': t2i_gt_groups=true needs c captions per image in order "
                           "(c*i .. c*i+c-1 belong to image i); give --captions-per-image")
        groups = c
    k1, k2 = min(p["k_i2t"], m), min(p["k_t2i"], n)
    bb = ctx.block_bytes

    vals, cand = row_candidates(sims, k1, bb)
    rev = image_positions_in_captions(sims, cand, bb)
    new_i2t = cand.gather(1, torch.sort(rev, dim=1, stable=True).indices)
    i2t_val = _lift(vals[:, 0], k1)

    vals_t, cand_t = column_candidates(sims, k2, bb)
    rev_t = caption_positions_in_images(sims, cand_t, bb, groups)
    new_t2i = cand_t.gather(1, torch.sort(rev_t, dim=1, stable=True).indices)
    t2i_val = _lift(vals_t[:, 0], k2)
    return OverrideRescoring(sims, new_i2t, i2t_val, new_t2i.T.contiguous(), t2i_val.T.contiguous(), bb)


RERANKERS.register("rr")(RerankerSpec(
    name="rr",
    summary="MTFN-RR cross-modal k-reciprocal re-ranking of the top-k candidates",
    defaults={"k_i2t": 15, "k_t2i": 20, "t2i_gt_groups": False},
    prepare=_prepare,
    source="Wang et al., Matching Images and Text with Multi-modal Tensor Fusion and Re-ranking, ACM MM 2019; "
           "github.com/Wangt-CN/MTFN-RR-PyTorch-Code rerank.py (K1 = 15 i2t, 20 t2i)",
))
