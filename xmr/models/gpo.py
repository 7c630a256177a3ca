"""Generalized Pooling Operator (GPO) of VSE∞ (Chen et al., CVPR 2021), reused by CODER's instance branch.

For a set of ``n`` local features, every feature dimension is sorted in descending order over the set, and the
pooled vector is a weighted sum over the sorted positions, ``v_d = Σ_k θ_k · sorted_d[k]``. The weights depend
only on the set size: the sinusoidal encoding of each rank index ``k = 0..n-1`` goes through a BiGRU (the two
directions averaged), a linear scorer and a softmax with temperature 0.1 over the ``n`` ranks (woodfrog/vse_infty
``lib/modules/aggr/gpo.py``). Mean pooling (uniform θ), max pooling (θ on rank 0) and K-max pooling are special
cases.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from xmr.core.errors import XmrError
from xmr.models.pooling import length_mask


def sinusoidal_encoding(length: int, dim: int) -> torch.Tensor:
    """(length, dim): ``p[k, 2j] = sin(k·u_j)``, ``p[k, 2j+1] = cos(k·u_j)``, ``u_j = 10000^(-2j/dim)``, k from 0."""
    if dim % 2:
        raise XmrError(f"gpo.pe_dim: the sin/cos encoding needs an even dimension, got {dim}")
    k = torch.arange(length, dtype=torch.float32)[:, None]
    u = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(length, dim)
    pe[:, 0::2] = torch.sin(k * u)
    pe[:, 1::2] = torch.cos(k * u)
    return pe


def sort_per_dimension(x: torch.Tensor, lengths: torch.Tensor, trim: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each feature dimension over the valid set elements, descending; padding stays last and is zeroed.

    Returns ``(sorted (B, T, D), valid (B, T, 1))`` with ``T = lengths.max()`` (``trim``) or ``x.shape[1]``.
    """
    t = int(lengths.max()) if trim else x.shape[1]
    x = x[:, :t]
    valid = length_mask(lengths, t).unsqueeze(-1)
    # padded entries must sort after every real value; finfo.min keeps this exact for any feature scale
    x = x.masked_fill(~valid, torch.finfo(x.dtype).min)
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        # torch's CPU sort of many short rows is 2-3x slower than numpy's; gather keeps it differentiable
        xt = x.transpose(1, 2).contiguous()
        order = torch.from_numpy(np.argsort(-xt.detach().numpy(), axis=-1))
        x = xt.gather(-1, order).transpose(1, 2)
    else:
        x = x.sort(dim=1, descending=True).values
    return x.masked_fill(~valid, 0.0), valid


class GPO(nn.Module):
    """Pool (B, T, D) features with valid ``lengths`` (B,) into (B, D).

    ``mlp_layers=1`` is the released code (``Linear(hidden, 1, bias=False)`` on the averaged BiGRU states);
    ``2`` is the "two-layer perceptron" wording of the CODER supplement (Linear-ReLU-Linear).
    """

    def __init__(self, pe_dim: int = 32, hidden_dim: int = 32, mlp_layers: int = 1, temperature: float = 0.1) -> None:
        super().__init__()
        self.pe_dim, self.hidden_dim, self.temperature = pe_dim, hidden_dim, temperature
        self.host_free: bool | None = None  # None: by device (see forward); tests force either path
        self._encodings: dict[tuple, torch.Tensor] = {}
        self.gru = nn.GRU(pe_dim, hidden_dim, num_layers=1, batch_first=True, bidirectional=True)
        if mlp_layers == 1:
            self.score = nn.Linear(hidden_dim, 1, bias=False)
        elif mlp_layers == 2:
            self.score = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, 1))
        else:
            raise XmrError(f"gpo.mlp_layers: expected 1 or 2, got {mlp_layers}")

    def pool_weights(self, lengths: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
        """(B, T, 1) softmax weights over the sorted positions (zero on padding); depend only on the lengths.

        Without ``max_len`` the GRU runs once per distinct set size in the batch, which reads the lengths on the
        host. With ``max_len`` (the padded width, known on the host) it runs over every size 1..max_len and the
        rows are picked on the device by ``lengths``: nothing waits for the device (the accelerator path).
        """
        if max_len is None:
            sizes, inverse = torch.unique(lengths.long().cpu(), return_inverse=True)
            return self._weights_by_size(sizes)[inverse.to(self.gru.weight_ih_l0.device)]
        # sizes max_len..1, longest first: packing needs no sort, so no index tensor is copied to the device
        weights = self._weights_by_size(torch.arange(max_len, 0, -1), sorted_sizes=True)
        return weights[(max_len - lengths.long()).clamp(0, max_len - 1)]

    def _weights_by_size(self, sizes: torch.Tensor, sorted_sizes: bool = False) -> torch.Tensor:
        """(S, T, 1) weights for each set size in ``sizes`` (CPU, int64), T = the largest."""
        param = self.gru.weight_ih_l0
        t = int(sizes.max())
        pe = self._encoding(t, param.device, param.dtype).unsqueeze(0).expand(len(sizes), t, self.pe_dim)
        packed = pack_padded_sequence(pe, sizes, batch_first=True, enforce_sorted=sorted_sizes)
        h, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=t)
        h = (h[..., : self.hidden_dim] + h[..., self.hidden_dim:]) / 2
        scores = self.score(h)  # (S, T, 1)
        # sorted sizes are t..1, made on the device: a host tensor copied there would wait for the device's queue
        on_device = torch.arange(t, 0, -1, device=param.device) if sorted_sizes else sizes.to(param.device)
        scores = scores.masked_fill(~length_mask(on_device, t).unsqueeze(-1), float("-inf"))
        return torch.softmax(scores / self.temperature, dim=1)

    def _encoding(self, t: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The (t, pe_dim) rank encoding, kept per device: made on the host, copied to an accelerator once."""
        if device.type == "cpu":
            return sinusoidal_encoding(t, self.pe_dim).to(dtype)
        key = (t, str(device), dtype)
        if key not in self._encodings:
            self._encodings[key] = sinusoidal_encoding(t, self.pe_dim).to(device, dtype)
        return self._encodings[key]

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # on an accelerator the lengths are not read on the host (each read stalls the device's queue of kernels):
        # sort over the whole padded width and take the weights of every size; the CPU keeps the cheaper path
        host_free = x.device.type != "cpu" if self.host_free is None else self.host_free
        sorted_x, _ = sort_per_dimension(x, lengths, trim=not host_free)
        weights = self.pool_weights(lengths, sorted_x.shape[1] if host_free else None)
        return (sorted_x * weights.to(sorted_x.dtype)).sum(1)
