"""Querybank normalisation with the dynamic inverted softmax (QB-Norm; Bogolin et al., CVPR 2022).

A *query bank* is a set of queries that are not the test queries (e.g. training captions). For each direction:

    norm[g]   = log Σ_{b in bank} exp(β·S_bank[b, g])              (gallery item g's scores over the bank)
    active    = {g : g is among the top-k gallery items of some bank query}
    R[q, g]   = β·A[q, g] - norm[g]   if query q's top-1 gallery item is in ``active``
              = A[q, g]               otherwise (the query is left as it was)

Parameters: ``bank_i2t``: similarities of bank *images* to the test captions, shape (B, M) (path to a .npy or an
array); ``bank_t2i``: similarities of the test images to bank *captions*, shape (N, B). With ``self_bank=true`` the
test queries themselves serve as the bank (transductive: then it is a gated inverted softmax). β = 20 and k = 1
are the defaults of the QB-Norm code. For COCO-1K folds a bank over the full 5K gallery is sliced to the fold.
"""

from __future__ import annotations

from pathlib import Path


from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring, iter_blocks
from xmr.rerank.fast import _first_argmax, lse_stats


def _load_bank(value, what: str, device: torch.device) -> torch.Tensor:
    if isinstance(value, (str, Path)):  # re-ranking opens no files: the CLI/results load .npy paths
        raise XmrError(f"re-ranker 'qbnorm': {what}={value}: pass the array (xmr.config.loader.load_array_params "
                       f"loads a .npy path)")
    t = torch.as_tensor(value).to(device=device, dtype=torch.float32)
    if t.ndim != 2:
        raise XmrError(f"re-ranker 'qbnorm': {what} must be a 2-D similarity matrix, got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise XmrError(f"re-ranker 'qbnorm': {what} contains NaN or inf values")
    return t


def _fit(bank: torch.Tensor, axis: int, size: int, part: slice | None, what: str, shape_doc: str) -> torch.Tensor:
    """The bank restricted to this matrix's gallery (axis ``axis`` must have ``size`` items)."""
    have = bank.shape[axis]
    if have == size:
        return bank
    if part is not None and have >= part.stop:
        return bank[:, part] if axis == 1 else bank[part]
    raise XmrError(f"re-ranker 'qbnorm': {what} has shape {tuple(bank.shape)}, expected {shape_doc}")


def _activation(bank: torch.Tensor, k: int, dim: int, size: int) -> torch.Tensor:
    """Boolean (size,): gallery items among the top-k of at least one bank query (bank queries along 1-dim)."""
    active = torch.zeros(size, dtype=torch.bool, device=bank.device)
    k = min(k, size)
    if dim == 1:  # bank queries are rows, gallery along columns
        for rows in iter_blocks(bank.shape[0], size * 12, 64 * 2**20):
            active[bank[rows].topk(k, dim=1).indices.reshape(-1)] = True
    else:
        for cols in iter_blocks(bank.shape[1], size * 12, 64 * 2**20):
            active[bank[:, cols].topk(k, dim=0).indices.reshape(-1)] = True
    return active


class QbNormRescoring(Rescoring):
    def __init__(self, sims: torch.Tensor, bank_i2t: torch.Tensor, bank_t2i: torch.Tensor, beta: float, k: int,
                 block_bytes: int) -> None:
        super().__init__(sims, block_bytes)
        n, m = sims.shape
        self.beta = beta
        self.norm_cap = lse_stats(bank_i2t, beta, beta, block_bytes)[0]  # (M,) over bank images
        self.norm_img = lse_stats(bank_t2i, beta, beta, block_bytes)[1]  # (N,) over bank captions
        active_cap = _activation(bank_i2t, k, dim=1, size=m)
        active_img = _activation(bank_t2i, k, dim=0, size=n)
        # which test queries get normalised: those whose top-1 gallery item is active
        self.flag_img = torch.empty(n, dtype=torch.bool, device=sims.device)
        self.flag_cap = torch.empty(m, dtype=torch.bool, device=sims.device)
        for rows in self.row_blocks():
            self.flag_img[rows] = active_cap[_first_argmax(sims[rows], dim=1)]
        for cols in self.col_blocks():
            self.flag_cap[cols] = active_img[_first_argmax(sims[:, cols], dim=0)]

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        return torch.where(self.flag_img[rows, None], self.beta * s - self.norm_cap[None, cols], s)

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        s = self.sims[rows, cols]
        return torch.where(self.flag_cap[None, cols], self.beta * s - self.norm_img[rows, None], s)


def _prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
    n, m = sims.shape
    if not p["beta"] > 0 or p["k"] < 1:
        raise XmrError(f"re-ranker 'qbnorm': needs beta > 0 and k >= 1, got beta={p['beta']}, k={p['k']}")
    if p["self_bank"]:
        if p["bank_i2t"] is not None or p["bank_t2i"] is not None:
            raise XmrError("re-ranker 'qbnorm': give either self_bank=true or bank_i2t/bank_t2i, not both")
        bank_i2t = bank_t2i = sims
    else:
        if p["bank_i2t"] is None or p["bank_t2i"] is None:
            raise XmrError("re-ranker 'qbnorm' needs a query bank: bank_i2t=<bank images x test captions .npy> and "
                           "bank_t2i=<test images x bank captions .npy>, or self_bank=true (transductive)")
        bank_i2t = _fit(_load_bank(p["bank_i2t"], "bank_i2t", sims.device), 1, m, ctx.cols, "bank_i2t",
                        f"(bank images, {m} captions)")
        bank_t2i = _fit(_load_bank(p["bank_t2i"], "bank_t2i", sims.device), 0, n, ctx.rows, "bank_t2i",
                        f"({n} images, bank captions)")
    return QbNormRescoring(sims, bank_i2t, bank_t2i, p["beta"], p["k"], ctx.block_bytes)


RERANKERS.register("qbnorm")(RerankerSpec(
    name="qbnorm",
    summary="QB-Norm: dynamic inverted softmax against a query bank",
    defaults={"beta": 20.0, "k": 1, "bank_i2t": None, "bank_t2i": None, "self_bank": False},
    prepare=_prepare,
    run_inputs={"bank_i2t": "qbnorm_bank_i2t.npy", "bank_t2i": "qbnorm_bank_t2i.npy"},  # rule score_bank
    source="Bogolin et al., Cross Modal Retrieval with Querybank Normalisation, CVPR 2022; "
           "github.com/ioanacroi/qb-norm dynamic_inverted_softmax.py (beta 20, k 1)",
))
