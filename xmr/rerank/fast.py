"""DVSE Fast Re-ranking (FR), Eqs. 13-15, in log space.

For A (N images x M captions):

    R_i2t[i, j] = γ2·A[i, j] - log Σ_l exp(γ1·A[l, j])     (normalise over the column: all images)
    R_t2i[i, j] = λ2·A[i, j] - log Σ_l exp(λ1·A[i, l])     (normalise over the row: all captions)

R = log Ã of Eq. 14 (exp(γ2 A_ij) / Σ_l exp(γ1 A_lj)), so rankings equal the paper's; image->text ranks rows of
R_i2t, text->image ranks columns of R_t2i. Only two vectors (column and row log-sum-exps) are stored besides A.

Named readings where the paper is ambiguous (method card §3, A16-A18):
- ``exclude_self`` (default false): Eq. 14 sums over all l (including the element itself, as printed); Eq. 13's
  second form sums over l != i. With γ1 = γ2 both give the same ranking; with γ1 != γ2 they differ.
- ``pool`` (default ``lse``): ``max`` uses Eq. 13's bound instead, γ2·A_ij - γ1·max_l A_lj (with
  ``exclude_self``: max over l != i, the bound as printed).
- the index typos of Eq. 13 (``A_{i,:}``, ``l != j``) are read as the column/row of the text (card §3.1); the
  literal reading would normalise each query's own row, which cannot change its ranking, so it is not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.lazy import is_tensor, torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring, arange, iter_blocks, map_blocks


# -- statistics of a matrix along each axis, computed in one streaming pass over row blocks ----------------------

# Above this spread of scale·A, exp(scale·(A - max)) could underflow float32; use per-block log-sum-exp instead.
_SHARED_SHIFT_SPAN = 80.0


def lse_stats(sims, col_scale: float, row_scale: float, block_bytes: int) -> tuple:
    """``col[j] = LSE_i(col_scale·A[i, j])`` (M,) and ``row[i] = LSE_j(row_scale·A[i, j])`` (N,), one pass.

    When every scaled entry lies within 80 of the scaled global maximum (cosine similarities with FR's scales),
    one shared shift makes every exponential safe and a single ``exp`` per scale serves both axes; otherwise each
    block is shifted by its own column/row maxima. On CPU the arithmetic runs in NumPy, whose vectorised exp and
    sums cost about a third of torch's here. A NumPy ``sims`` gives NumPy statistics, a tensor gives tensors.
    """
    n, m = sims.shape
    given_numpy = not is_tensor(sims)
    cpu = given_numpy or sims.device.type == "cpu"
    xp = np if cpu else torch
    a = sims if given_numpy else sims.detach().numpy() if cpu else sims
    lo, hi = (float(a.min()), float(a.max())) if given_numpy else map(float, torch.aminmax(sims))  # aminmax: 1 pass
    shared = max(col_scale, row_scale) * (hi - lo) <= _SHARED_SHIFT_SPAN
    on = {} if cpu else {"device": sims.device}  # torch allocates on the CPU unless told
    col = xp.zeros(m, dtype=xp.float64, **on) if shared else xp.full((m,), -np.inf, dtype=xp.float32, **on)
    row = xp.empty(n, dtype=xp.float32, **on)

    def block(rows: slice):
        """Writes the block's rows of ``row``; returns its column statistic, combined below in block order."""
        s = a[rows]
        if shared:
            e = s * col_scale
            e -= col_scale * hi
            xp.exp(e, out=e)  # in (e^-80, 1]: no overflow, no underflow
            col_part = e.sum(0)  # float32 partial sums (a float64 total below)
            if row_scale != col_scale:
                e = s * row_scale
                e -= row_scale * hi
                xp.exp(e, out=e)
            row[rows] = xp.log(e.sum(1)) + row_scale * hi
            return col_part
        x = s * col_scale
        top = xp.amax(x, 0)
        x -= top[None, :]
        xp.exp(x, out=x)
        col_part = xp.log(x.sum(0)) + top
        y = s * row_scale
        top = xp.amax(y, 1)
        y -= top[:, None]
        xp.exp(y, out=y)
        row[rows] = xp.log(y.sum(1)) + top
        return col_part

    for col_part in map_blocks(block, iter_blocks(n, m * 4 * 2, block_bytes), "cpu" if cpu else sims.device):
        if shared:
            col += col_part
        else:
            col = xp.logaddexp(col, col_part)
    if shared:
        col = xp.log(col) + col_scale * hi
    if given_numpy:
        return col.astype(np.float32), row
    if cpu:
        col, row = torch.from_numpy(col), torch.from_numpy(row)
    return col.float(), row.float()


def top2_stats(sims: torch.Tensor, block_bytes: int) -> tuple[torch.Tensor, ...]:
    """Largest and second-largest value of each column and each row, and the index of the largest.

    Returns ``col_top (2, M), col_arg (M,), row_top (N, 2), row_arg (N,)``; the second value is -inf on an axis
    of length one. Ties pick the lowest index as the arg-max.
    """
    n, m = sims.shape
    dev = sims.device
    col_top = torch.full((2, m), -math.inf, device=dev)
    col_arg = torch.zeros(m, dtype=torch.long, device=dev)
    row_top = torch.full((n, 2), -math.inf, device=dev)
    row_arg = torch.zeros(n, dtype=torch.long, device=dev)
    for rows in iter_blocks(n, m * 4 * 3, block_bytes):
        s = sims[rows]
        k = min(2, m)
        row_top[rows, :k] = s.topk(k, dim=1).values
        row_arg[rows] = _first_argmax(s, dim=1)
        block_top = s.topk(min(2, s.shape[0]), dim=0).values
        block_arg = _first_argmax(s, dim=0) + rows.start
        # strictly greater: on ties the earlier (lower) row index stays the arg-max
        col_arg = torch.where(block_top[0] > col_top[0], block_arg, col_arg)
        col_top = torch.cat([col_top, block_top], dim=0).topk(2, dim=0).values
    return col_top, col_arg, row_top, row_arg


def _first_argmax(s: torch.Tensor, dim: int) -> torch.Tensor:
    """Index of the first maximum along ``dim`` (torch.argmax does not promise which of tied maxima it returns)."""
    mx = s.amax(dim=dim, keepdim=True)
    n = s.shape[dim]
    idx = torch.arange(n, device=s.device).view([-1 if d == dim else 1 for d in range(s.ndim)])
    return torch.where(s == mx, idx, n).amin(dim=dim)


def lse_stats_excluding(sims: torch.Tensor, col_scale: float, row_scale: float, col_skip: torch.Tensor,
                        row_skip: torch.Tensor, block_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`lse_stats` but leaving out one entry per column (row ``col_skip[j]``) and per row
    (column ``row_skip[i]``); an axis with nothing left gives -inf."""
    n, m = sims.shape
    dev = sims.device
    col = torch.full((m,), -math.inf, device=dev)
    row = torch.empty(n, device=dev)
    cols_idx = torch.arange(m, device=dev)
    for rows in iter_blocks(n, m * 4 * 4, block_bytes):
        s = sims[rows]
        ridx = torch.arange(rows.start, rows.stop, device=dev)[:, None]
        a = (s * col_scale).masked_fill(ridx == col_skip[None, :], -math.inf)
        col = torch.logaddexp(col, torch.logsumexp(a, dim=0))
        b = (s * row_scale).masked_fill(cols_idx[None, :] == row_skip[rows, None], -math.inf)
        row[rows] = torch.logsumexp(b, dim=1)
    return col, row


# -- FR scores ---------------------------------------------------------------------------------------------------

@dataclass
class _AxisStats:
    """Normaliser statistics of the gallery axis seen by one direction (indexed by gallery item)."""

    lse: torch.Tensor | None = None  # LSE over queries of scale·A, including the element itself
    lse_excl: torch.Tensor | None = None  # same without the arg-max query (only needed with exclude_self)
    arg: torch.Tensor | None = None  # query index of the maximum
    top1: torch.Tensor | None = None
    top2: torch.Tensor | None = None


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate on both sides of -ln 2."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def _fr_block(s: torch.Tensor, st: _AxisStats, self_max, num: float, den: float, pool: str,
              exclude_self: bool, shape) -> torch.Tensor:
    """FR scores of a block ``s``. ``st`` holds the normaliser statistics of the axis normalised over, already
    indexed to this block; ``shape(v)`` makes such a vector broadcast against ``s``; ``self_max()`` is the mask of
    entries that are their normalising axis's maximum (only built when ``exclude_self``)."""
    if pool == "lse":
        if not exclude_self:
            if not is_tensor(s):  # NumPy's in-place arithmetic, the cheaper path on CPU
                out = s * np.float32(num)
                out -= shape(st.lse)
                return out
            if s.device.type == "cpu":
                return torch.from_numpy(_fr_block(s.detach().numpy(), _AxisStats(lse=st.lse.numpy()), self_max, num,
                                                  den, pool, exclude_self, shape))
            return torch.add(-shape(st.lse), s, alpha=num)  # num·s - lse in one pass
        lse = shape(st.lse)
        # entries that are not their axis's maximum have e^(den·s - lse) <= 1/2, so log1mexp is well-conditioned
        x = (den * s - lse).clamp(max=-1e-7)
        others = torch.where(self_max(), shape(st.lse_excl), lse + _log1mexp(x))
        return num * s - others
    if not exclude_self:
        return num * s - den * shape(st.top1)
    return num * s - den * torch.where(self_max(), shape(st.top2), shape(st.top1))


def _select(st: _AxisStats, idx: slice) -> _AxisStats:
    pick = (lambda v: None if v is None else v[idx])
    return _AxisStats(pick(st.lse), pick(st.lse_excl), pick(st.arg), pick(st.top1), pick(st.top2))


class FastRescoring(Rescoring):
    """FR for both directions; see the module docstring for the formulas."""

    def __init__(self, sims: torch.Tensor, gamma1: float, gamma2: float, lambda1: float, lambda2: float,
                 pool: str = "lse", exclude_self: bool = False, block_bytes: int = 64 * 2**20) -> None:
        super().__init__(sims, block_bytes)
        self.g1, self.g2, self.l1, self.l2 = gamma1, gamma2, lambda1, lambda2
        self.pool, self.exclude_self = pool, exclude_self
        self.col, self.row = _AxisStats(), _AxisStats()  # i2t normalises over columns, t2i over rows
        if pool == "lse":
            self.col.lse, self.row.lse = lse_stats(sims, gamma1, lambda1, block_bytes)
        if pool == "max" or exclude_self:
            col_top, col_arg, row_top, row_arg = top2_stats(sims, block_bytes)
            self.col.arg, self.row.arg = col_arg, row_arg
            self.col.top1, self.col.top2 = col_top[0], col_top[1]
            self.row.top1, self.row.top2 = row_top[:, 0], row_top[:, 1]
        if pool == "lse" and exclude_self:
            self.col.lse_excl, self.row.lse_excl = lse_stats_excluding(sims, gamma1, lambda1, self.col.arg,
                                                                       self.row.arg, block_bytes)

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        st = _select(self.col, cols)  # one statistic per caption (column)
        self_max = lambda: arange(rows, s.device)[:, None] == st.arg[None, :]  # noqa: E731
        return _fr_block(s, st, self_max, self.g2, self.g1, self.pool, self.exclude_self, lambda v: v[None, :])

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        st = _select(self.row, rows)  # one statistic per image (row)
        self_max = lambda: arange(cols, s.device)[None, :] == st.arg[:, None]  # noqa: E731
        return _fr_block(s, st, self_max, self.l2, self.l1, self.pool, self.exclude_self, lambda v: v[:, None])


def _prepare(sims, p: dict, ctx: RerankContext) -> Rescoring:
    for k in ("gamma1", "gamma2", "lambda1", "lambda2"):
        if not p[k] > 0:
            raise XmrError(f"re-ranker 'fr': {k} must be > 0, got {p[k]}")
    if not is_tensor(sims) and (p["pool"] != "lse" or p["exclude_self"]):
        sims = torch.as_tensor(sims)  # the top-2 statistics of these readings are computed in torch
    return FastRescoring(sims, p["gamma1"], p["gamma2"], p["lambda1"], p["lambda2"], p["pool"], p["exclude_self"],
                         ctx.block_bytes)


RERANKERS.register("fr")(RerankerSpec(
    name="fr",
    summary="DVSE Fast Re-ranking: temperature-scaled cross-direction softmax (Eqs. 13-15)",
    # per-dataset paper values (COCO/F30K 25/25, 20/20; CUB 9/8, 8/17) are rows of config/rerank/fr.yaml
    defaults={"gamma1": 25.0, "gamma2": 25.0, "lambda1": 20.0, "lambda2": 20.0, "pool": "lse",
              "exclude_self": False},
    choices={"pool": ("lse", "max")},
    prepare=_prepare,
    source="Wei et al., Dynamic Visual Semantic Sub-Embeddings and Fast Re-Ranking, arXiv 2309.08154, §III-D",
    numpy=True,  # the default reading (pool lse, all l) runs in NumPy on a NumPy matrix
))
