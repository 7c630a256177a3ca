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


def last_pool(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The state at the last valid position (VSE++'s one-directional GRU read at the caption's last token; PVSE's
    sentence embedding)."""
    index = (lengths.long() - 1).clamp(min=0).to(x.device)
    return x[torch.arange(x.shape[0], device=x.device), index]


def final_states_pool(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The final states of a BiGRU whose two directions are concatenated (``text.bigru_directions: concat``): the
    forward half at the last valid position, the backward half at position 0 (PVSE without ``--legacy``)."""
    half = x.shape[-1] // 2
    return torch.cat([last_pool(x[..., :half], lengths), x[:, 0, half:]], dim=-1)


#: the parameter-free poolings of token or region outputs, by the name configs use
POOLS = {"mean": mean_pool, "max": max_pool, "last": last_pool, "final": final_states_pool}


#: l2-normalisation conventions (``model.l2_norm``): ``clamp`` = ``x / max(‖x‖, 1e-12)`` (torch's F.normalize,
#: xmr's default); ``plus_eps`` = ``x / (‖x‖ + 1e-8)`` (the reference code of VSE++ and VSE∞, ``l2norm``)
L2_NORMS = ("clamp", "plus_eps")


def l2_normalize(x: torch.Tensor, mode: str = "clamp") -> torch.Tensor:
    """Unit rows along the last dimension, in one of the :data:`L2_NORMS` conventions."""
    if mode == "plus_eps":
        return x / (x.pow(2).sum(-1, keepdim=True).sqrt() + 1e-8)
    return torch.nn.functional.normalize(x, dim=-1)
