"""DivE's set prediction module (Kim, Kim & Kwak, CVPR'23, §3.2): slot attention with three changes.

K learnable slots E⁰ (K, D) are refined by T weight-shared aggregation blocks over local features ψ (N, d_in):

    q = LN_q(E) W_q,  k = (LN_ctx(ψ) + P) W_k,  v = LN_ctx(ψ) W_v            (h heads × d_head; P = positions)
    A[n, k] = softmax over SLOTS k of q_k·k_n / √d_head                          (Eq. 2: slots compete)
    Â[n, k] = A[n, k] / Σ_n' A[n', k]                                            (renormalise over inputs)

A padded input n (``pad_mode``): ``zero`` sets A[n, ·] = 0 (no mass); ``code`` is the released code's masking of
its logits before the slot softmax, A[n, ·] = 1/K, which still enters Σ_n' and the weighted mean of the values.
    Ē = (Âᵀ v) W_o + E                 (residual update instead of slot attention's GRU)   (Eq. 3)
    E' = Ē + MLP(LN_ff(Ē))             (MLP = Linear D→4D, GELU, Linear 4D→D)               (Eq. 4)

Output S = LN_out(E^T) + LN_g(global) (Eq. 5), L2-normalised (as the released code does). The three changes
from vanilla slot attention (learnable initial slots, residual instead of GRU update, the global feature added)
are switches, for the ablation of the paper's §B.3.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xmr.core.errors import XmrError
from xmr.models.pooling import length_mask


POSITION_LENGTHS = ("caption", "batch")


def sine_positions_1d(lengths: torch.Tensor, max_len: int, dim: int, length: str = "caption") -> torch.Tensor:
    """(B, T, dim) sine/cosine encoding of word positions.

    ``length``: ``caption`` = positions 0..n-1 of each caption over its own length n; ``batch`` = DivE's released
    code (``PositionEmbeddingSine1D(normalize=True)``): positions 1..T over the padded batch length T (+1e-6), the
    same for every caption of the batch, which makes an embedding depend on the batch it is encoded in (method
    card A4). The channel layout ([sin…, cos…] here, interleaved in the code) is a fixed permutation that the key
    projection absorbs.
    """
    if length == "batch":
        pos = torch.arange(1, max_len + 1, device=lengths.device, dtype=torch.float32)[None, :]
        return _sine((pos / (max_len + 1e-6) * (2 * math.pi)).expand(len(lengths), -1), dim)
    if length != "caption":
        raise XmrError(f"model.text_pos_length: {length!r} is not one of {', '.join(POSITION_LENGTHS)}")
    pos = torch.arange(max_len, device=lengths.device, dtype=torch.float32)[None, :]
    pos = pos / lengths.clamp(min=1).to(torch.float32)[:, None] * (2 * math.pi)
    return _sine(pos, dim)


def sine_positions_2d(num_positions: int, dim: int, device: torch.device | None = None) -> torch.Tensor:
    """(N, dim) DETR-style 2-D encoding of a square grid (N = s²): dim/2 channels for y, dim/2 for x."""
    side = int(round(math.sqrt(num_positions)))
    if side * side != num_positions:
        raise XmrError(f"model.image_pos_enc: sine2d needs a square feature grid, got {num_positions} local "
                       f"features; use image_pos_enc: none for region features")
    coords = (torch.arange(side, device=device, dtype=torch.float32) + 0.5) / side * (2 * math.pi)
    ys, xs = torch.meshgrid(coords, coords, indexing="ij")
    half = dim // 2
    return torch.cat([_sine(ys.reshape(1, -1), half)[0], _sine(xs.reshape(1, -1), dim - half)[0]], dim=-1)


def _sine(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """pos (B, T) -> (B, T, dim): [sin(pos/ω_i), cos(pos/ω_i)] with ω_i = 10000^(2i/dim)."""
    n_freq = (dim + 1) // 2
    freq = 10000.0 ** (torch.arange(n_freq, device=pos.device, dtype=torch.float32) * 2 / max(dim, 1))
    angles = pos[..., None] / freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[..., :dim]


class AggregationBlock(nn.Module):
    """One DivE aggregation block (Eqs. 2-4); the module is applied T times with the same weights."""

    def __init__(self, in_dim: int, slot_dim: int, heads: int = 4, dim_head: int = 512, ff_mult: int = 4,
                 dropout: float = 0.1, pad_mode: str = "zero", update: str = "residual") -> None:
        super().__init__()
        if pad_mode not in ("zero", "code"):
            raise XmrError(f"model.pad_mode: {pad_mode!r} is not one of zero, code")
        if update not in ("residual", "gru"):
            raise XmrError(f"model.slot_update: {update!r} is not one of residual, gru")
        inner = heads * dim_head
        self.heads, self.dim_head, self.pad_mode, self.update = heads, dim_head, pad_mode, update
        self.ln_q, self.ln_ctx, self.ln_ff = nn.LayerNorm(slot_dim), nn.LayerNorm(in_dim), nn.LayerNorm(slot_dim)
        self.to_q = nn.Linear(slot_dim, inner, bias=False)
        self.to_k = nn.Linear(in_dim, inner, bias=False)
        self.to_v = nn.Linear(in_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, slot_dim), nn.Dropout(dropout))
        self.gru = nn.GRUCell(slot_dim, slot_dim) if update == "gru" else None
        self.ff = nn.Sequential(nn.Linear(slot_dim, ff_mult * slot_dim), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(ff_mult * slot_dim, slot_dim))

    def project_context(self, context: torch.Tensor, pos: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, h, N, d_head) of the inputs: they do not depend on the slots, so the T iterations
        share one projection."""
        b, n, _ = context.shape
        ctx = self.ln_ctx(context)
        key = self.to_k(ctx if pos is None else ctx + pos).view(b, n, self.heads, self.dim_head).transpose(1, 2)
        val = self.to_v(ctx).view(b, n, self.heads, self.dim_head).transpose(1, 2)
        return key, val

    def attention(self, slots: torch.Tensor, context: torch.Tensor, valid: torch.Tensor,
                  pos: torch.Tensor | None = None,
                  keys_values: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(updates (B, K, D), attention Â (B, h, K, N) renormalised over inputs)."""
        b, k, _ = slots.shape
        key, val = keys_values if keys_values is not None else self.project_context(context, pos)
        q = self.to_q(self.ln_q(slots)).view(b, k, self.heads, self.dim_head).transpose(1, 2)
        logits = q @ key.transpose(-1, -2) / math.sqrt(self.dim_head)  # (B, h, K, N)
        pad = ~valid[:, None, None, :]
        if self.pad_mode == "code":
            # kdwonn/DivE agg_block/attention.py: a padded input's logits are the dtype's most negative value before
            # the softmax over slots, so every slot gets exactly 1/K of it, and it stays in the renormalisation
            logits = logits.masked_fill(pad, -torch.finfo(logits.dtype).max)
        attn = logits.softmax(dim=2)  # over SLOTS: the slots compete for each input
        if self.pad_mode == "zero":  # padded inputs get no mass
            attn = attn.masked_fill(pad, 0.0)
        attn = attn / (attn.sum(dim=-1, keepdim=True) + 1e-7)
        out = (attn @ val).transpose(1, 2).reshape(b, k, self.heads * self.dim_head)
        return self.to_out(out), attn

    def forward(self, slots: torch.Tensor, context: torch.Tensor, valid: torch.Tensor,
                pos: torch.Tensor | None = None,
                keys_values: tuple[torch.Tensor, torch.Tensor] | None = None,
                return_attention: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The refined slots; with ``return_attention`` also this block's attention Â (B, h, K, N)."""
        updates, attn = self.attention(slots, context, valid, pos, keys_values)
        if self.gru is not None:  # vanilla slot attention's update (ablation of change 2)
            b, k, d = slots.shape
            slots = self.gru(updates.reshape(b * k, d), slots.reshape(b * k, d)).view(b, k, d)
        else:
            slots = updates + slots
        slots = slots + self.ff(self.ln_ff(slots))
        return (slots, attn) if return_attention else slots


class SetPredictionModule(nn.Module):
    """``forward(local (B, N, d_in), lengths, global (B, D), pos)`` -> dict with ``embeddings`` (B, K, D)
    (L2-normalised), ``slots`` = LN_out(E^T) (B, K, D) before the global feature is added (DivE's diversity
    regulariser acts on these) and ``attention`` (B, K, N): the last iteration's Â, averaged over heads."""

    def __init__(self, in_dim: int, embed_dim: int, num_slots: int = 4, iterations: int = 4, heads: int = 4,
                 dim_head: int = 512, ff_mult: int = 4, dropout: float = 0.1, pad_mode: str = "zero",
                 learnable_slots: bool = True, update: str = "residual", add_global: bool = True) -> None:
        super().__init__()
        self.num_slots, self.iterations, self.add_global = num_slots, iterations, add_global
        self.learnable_slots = learnable_slots
        if learnable_slots:
            self.slots = nn.Parameter(torch.randn(num_slots, embed_dim))  # E⁰, shared by all samples
        else:
            # vanilla slot attention: slots drawn from N(μ, σ²) per sample (ablation of change 1)
            self.slots_mu = nn.Parameter(torch.randn(1, 1, embed_dim))
            self.slots_log_sigma = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.block = AggregationBlock(in_dim, embed_dim, heads, dim_head, ff_mult, dropout, pad_mode, update)
        self.ln_out = nn.LayerNorm(embed_dim)
        self.ln_global = nn.LayerNorm(embed_dim)

    def initial_slots(self, batch: int) -> torch.Tensor:
        if self.learnable_slots:
            return self.slots[None].expand(batch, -1, -1)
        mu = self.slots_mu.expand(batch, self.num_slots, -1)
        if not self.training:
            return mu  # deterministic embeddings at test time: the mean of the slot distribution
        return mu + self.slots_log_sigma.exp() * torch.randn_like(mu)

    def forward(self, local: torch.Tensor, lengths: torch.Tensor, global_feat: torch.Tensor,
                pos: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        valid = length_mask(lengths, local.shape[1])
        slots = self.initial_slots(local.shape[0])
        keys_values = self.block.project_context(local, pos)
        for _ in range(self.iterations - 1):
            slots = self.block(slots, local, valid, pos, keys_values)
        slots, attn = self.block(slots, local, valid, pos, keys_values, return_attention=True)
        slots = self.ln_out(slots)
        out = slots + self.ln_global(global_feat)[:, None, :] if self.add_global else slots
        # the last iteration's attention of each slot over the inputs, averaged over heads (DivE Fig. 4's maps)
        return {"embeddings": F.normalize(out, dim=-1), "slots": slots, "attention": attn.mean(dim=1)}


__all__ = ["AggregationBlock", "SetPredictionModule", "sine_positions_1d", "sine_positions_2d"]
