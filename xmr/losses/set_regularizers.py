"""Regularisers of embedding sets: MMD between the modalities and within-set diversity (PVSE, DivE)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mmd_rbf(x: torch.Tensor, y: torch.Tensor, gamma: float = 0.5, squared_distance: bool = False) -> torch.Tensor:
    """Biased MMD estimate mean k(x, x') - 2 mean k(x, y) + mean k(y, y') between two samples of vectors.

    ``x`` (n, D) and ``y`` (m, D) (sets are flattened by the caller: every element is one sample).
    k(a, b) = exp(-gamma · ‖a - b‖), the *non-squared* distance of PVSE's and DivE's code (gamma 0.5);
    ``squared_distance=True`` gives the Gaussian kernel exp(-gamma · ‖a - b‖²).
    """
    def kernel(a, b):
        d = torch.cdist(a, b)
        return torch.exp(-gamma * (d * d if squared_distance else d))

    return kernel(x, x).mean() - 2 * kernel(x, y).mean() + kernel(y, y).mean()


def gram_diversity(residuals: torch.Tensor) -> torch.Tensor:
    """PVSE's diversity loss: ‖G - diag G‖_F / K² of the Gram matrix G of the L2-normalised set elements,
    averaged over the batch. ``residuals`` (B, K, D); 0 for K = 1."""
    x = F.normalize(residuals, dim=-1)
    k = x.shape[1]
    gram = x @ x.transpose(1, 2)
    off = gram * (1 - torch.eye(k, device=x.device, dtype=x.dtype))
    return (off.flatten(1).norm(dim=1) / (k * k)).mean()


def pairwise_uniformity(elements: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
    """DivE's diversity loss: mean over unordered pairs x ≠ x' of one set of exp(-scale · ‖x - x'‖²) with
    L2-normalised elements, averaged over the batch. ``elements`` (B, K, D); 0 for K = 1."""
    x = F.normalize(elements, dim=-1)
    k = x.shape[1]
    if k < 2:
        return x.sum() * 0.0
    sq = (2.0 - 2.0 * (x @ x.transpose(1, 2))).clamp(min=0.0)  # ‖x - x'‖² of unit vectors, (B, K, K)
    iu = torch.triu_indices(k, k, offset=1, device=x.device)
    return torch.exp(-scale * sq[:, iu[0], iu[1]]).mean()


__all__ = ["mmd_rbf", "gram_diversity", "pairwise_uniformity"]
