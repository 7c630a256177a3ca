"""Image side on precomputed local features: projection to the joint space (FC plus VSE∞'s or DivE's residual MLP)."""

from __future__ import annotations

import torch
from torch import nn

from xmr.core.errors import XmrError


class MLP(nn.Module):
    """Linear layers with BatchNorm + ReLU between them (VSE∞'s residual branch)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, layers: int = 2) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.norms = nn.ModuleList(nn.BatchNorm1d(d) for d in dims[1:-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.norms):
                x = torch.relu(self.norms[i](x))
        return x.reshape(*shape[:-1], -1)


#: what the residual MLP reads: the raw local features (VSE∞) or the FC's projection of them (DivE's code)
MLP_INPUTS = ("local", "projected")


class LocalProjection(nn.Module):
    """(B, R, F) -> (B, R, D): FC, optionally plus a 2-layer MLP residual (``residual_mlp``, hidden D/2).
    ``mlp_input``: ``local`` = fc(x) + MLP(x), the MLP F -> D/2 -> D (VSE∞ region mode); ``projected`` =
    fc(x) + MLP(fc(x)), the MLP D -> D/2 -> D (kdwonn/DivE model_spm.py ``EncoderImage`` with ``--gpo_1x1``)."""

    def __init__(self, in_dim: int, embed_dim: int, residual_mlp: bool = False, mlp_input: str = "local") -> None:
        super().__init__()
        if mlp_input not in MLP_INPUTS:
            raise XmrError(f"model.image_mlp_input: {mlp_input!r} is not one of {', '.join(MLP_INPUTS)}")
        self.fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.projected = mlp_input == "projected"
        mlp_in = embed_dim if self.projected else in_dim
        self.mlp = MLP(mlp_in, embed_dim // 2, embed_dim, 2) if residual_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if self.mlp is None:
            return y
        return y + self.mlp(y if self.projected else x)
