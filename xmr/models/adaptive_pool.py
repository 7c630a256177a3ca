"""ADPOOL, the adaptive pooling of VSE+2AD (Zhang et al., EACL 2023), and K-max pooling (its "manual" baseline).

Given token features X (B, T, d) with valid lengths, each dimension is sorted over the valid tokens (descending)
into U, then (paper §3.2, released code ``modules/adcap.py``):

- token level:     θ = softmax_t(relu(U W_tok + b_tok)),  t_tok = Σ_t θ_t ⊙ U_t
                   (W_tok ∈ R^{d×d}: a weight per dimension, the code; ``token_weight="scalar"`` is the paper's
                   Eq. 3 reading, θ = softmax_t(U w), w ∈ R^d)
- embedding level: δ = softmax_t(U) per dimension, t_emb = Σ_t δ_t ⊙ U_t (a "soft max-pool", no parameters)
- balance:         [ω1, ω2] = softmax([t_tok w_bal + b, t_emb w_bal + b]),  t = ω1 t_tok + ω2 t_emb

The released code does not mask padded tokens in the token-level softmax (padded rows are zeros that still take
weight mass); ``mask_pad_in_token_softmax=True`` restricts it to the valid tokens (the paper's formula over the
set). ``branches`` gives the Table 3 ablations, ``fixed_balance`` the fixed (ω_tok, ω_emb) rows of Table C-2.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xmr.core.errors import XmrError
from xmr.models.gpo import sort_per_dimension


def kmax_pool(x: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Mean of the ``min(k, length)`` largest values of each dimension over the valid tokens (K-MaxPool)."""
    sorted_x, _ = sort_per_dimension(x, lengths)
    kk = lengths.clamp(max=k).to(sorted_x.dtype)
    top = torch.arange(sorted_x.shape[1], device=x.device)[None, :] < kk[:, None]
    return (sorted_x * top.unsqueeze(-1)).sum(1) / kk[:, None]


class AdaptivePool(nn.Module):
    """(B, T, d) features + lengths (B,) -> (B, d)."""

    def __init__(self, dim: int, token_weight: str = "per_dim", mask_pad_in_token_softmax: bool = False,
                 branches: str = "both", fixed_balance: list[float] | None = None) -> None:
        super().__init__()
        if token_weight not in ("per_dim", "scalar"):
            raise XmrError(f"model.adpool.token_weight: expected per_dim or scalar, got {token_weight!r}")
        if branches not in ("both", "token", "embedding"):
            raise XmrError(f"model.adpool.branches: expected both, token or embedding, got {branches!r}")
        self.token_weight, self.branches = token_weight, branches
        self.mask_pad = mask_pad_in_token_softmax
        self.token = nn.Linear(dim, dim if token_weight == "per_dim" else 1, bias=token_weight == "per_dim")
        r = math.sqrt(6.0 / (self.token.in_features + self.token.out_features))  # Xavier-uniform, as the code
        nn.init.uniform_(self.token.weight, -r, r)
        if self.token.bias is not None:
            nn.init.zeros_(self.token.bias)
        self.balance = nn.Linear(dim, 1)
        if fixed_balance is not None:
            if len(fixed_balance) != 2 or abs(sum(fixed_balance) - 1) > 1e-6 or min(fixed_balance) < 0:
                raise XmrError(f"model.adpool.fixed_balance: expected [w_tok, w_emb] >= 0 summing to 1, "
                               f"got {fixed_balance}")
            self.register_buffer("fixed_balance", torch.tensor(fixed_balance, dtype=torch.float32),
                                 persistent=False)
        else:
            self.fixed_balance = None

    def token_level(self, u: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        logits = self.token(u)
        if self.token_weight == "per_dim":
            logits = torch.relu(logits)
        if self.mask_pad:
            logits = logits.masked_fill(~valid, float("-inf"))
        return (torch.softmax(logits, dim=1) * u).sum(1)

    @staticmethod
    def embedding_level(u: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(u.masked_fill(~valid, float("-inf")), dim=1)
        return (w * u).sum(1)

    def balance_weights(self, t_tok: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        """(B, 2): [ω_tok, ω_emb] per sample."""
        if self.fixed_balance is not None:
            return self.fixed_balance.to(t_tok.dtype).expand(t_tok.shape[0], 2)
        z = torch.stack([t_tok, t_emb], dim=1)  # (B, 2, d)
        return torch.softmax(self.balance(z).squeeze(-1), dim=1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        u, valid = sort_per_dimension(x, lengths, trim=False)  # the code keeps every padded position
        if self.branches == "token":
            return self.token_level(u, valid)
        if self.branches == "embedding":
            return self.embedding_level(u, valid)
        t_tok, t_emb = self.token_level(u, valid), self.embedding_level(u, valid)
        w = self.balance_weights(t_tok, t_emb)
        return w[:, :1] * t_tok + w[:, 1:] * t_emb
