"""Pooling of local features ``(B, T, D)`` with valid lengths ``(B,)`` into one vector per sample."""

from __future__ import annotations

import torch


def length_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, T) bool, True on valid positions."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def mean_pool(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    m = length_mask(lengths, x.shape[1]).unsqueeze(-1).to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1)


def max_pool(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    m = length_mask(lengths, x.shape[1]).unsqueeze(-1)
    return x.masked_fill(~m, torch.finfo(x.dtype).min).max(1).values
