"""Image side on precomputed local features: projection to the joint space (FC, plus VSE∞'s residual MLP)."""

from __future__ import annotations

import torch
from torch import nn


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


class LocalProjection(nn.Module):
    """(B, R, F) -> (B, R, D): FC, optionally plus a 2-layer MLP residual (``residual_mlp``, VSE∞ region mode)."""

    def __init__(self, in_dim: int, embed_dim: int, residual_mlp: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.mlp = MLP(in_dim, embed_dim // 2, embed_dim, 2) if residual_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y + self.mlp(x) if self.mlp is not None else y
