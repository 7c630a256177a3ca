"""One modality's pooling as a module chosen by name: ``Pooler(kind, dim, ...)`` turns local features (B, T, D) with
valid lengths (B,) into (B, D). The parameter-free kinds are :data:`xmr.models.pooling.POOLS` (mean, max, last,
final); ``kmax`` averages the K largest values of each dimension (VSE+2AD's manual baseline); ``gpo`` is VSE∞'s
Generalized Pooling Operator (:mod:`xmr.models.gpo`) and ``adpool`` VSE+2AD's adaptive pooling
(:mod:`xmr.models.adaptive_pool`), each with its own weights. Methods that choose their pooling by config (VSE+2AD,
DVSE) hold one Pooler per modality, so a base and the method that extends it pool with the same module."""

from __future__ import annotations

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.models.adaptive_pool import AdaptivePool, kmax_pool
from xmr.models.gpo import GPO
from xmr.models.pooling import POOLS

POOLER_KINDS = (*POOLS, "kmax", "gpo", "adpool")


class Pooler(nn.Module):
    """``kind`` one of :data:`POOLER_KINDS`; ``gpo``/``adpool``: the keyword settings of :class:`GPO` /
    :class:`AdaptivePool` (a method's ``model.gpo`` / ``model.adpool`` section); ``kmax_k``: K of ``kmax``.
    The weights sit in ``.gpo`` or ``.adpool`` (the names VSE+2AD checkpoints hold)."""

    def __init__(self, kind: str, dim: int, gpo: dict | None = None, adpool: dict | None = None,
                 kmax_k: int = 1, where: str = "pool") -> None:
        super().__init__()
        if kind not in POOLER_KINDS:
            raise XmrError(f"{where}: {kind!r} is not one of {', '.join(POOLER_KINDS)}")
        self.kind, self.k = kind, kmax_k
        self.adpool = AdaptivePool(dim, **(adpool or {})) if kind == "adpool" else None
        self.gpo = GPO(**(gpo or {})) if kind == "gpo" else None

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.adpool is not None:
            return self.adpool(x, lengths)
        if self.gpo is not None:
            return self.gpo(x, lengths)
        if self.kind == "kmax":
            return kmax_pool(x, lengths, self.k)
        return POOLS[self.kind](x, lengths)


__all__ = ["POOLER_KINDS", "Pooler"]
