"""PIE-Net set heads (PVSE, Song & Soleymani CVPR'19; reused by DVSE): K embeddings from K attention heads.

For one sample with local features ``z`` (R, F) and a global embedding ``g`` (D):

    A      = softmax_R( W2 tanh(W1 zᵀ) )          (K, R)   Lin et al. 2017 structured self-attention, K heads
    u_k    = Σ_r A[k, r] z_r                        (K, F)
    v̂_k    = dropout( s(W u_k + b) )                (K, D)   s = sigmoid in PVSE ("activation s" in DVSE)
    v_k    = LN( g + m_k · v̂_k )                    (K, D)   m = optional per-slot gate (DVSE's dynamic mask)

``norm: per_term`` normalises the two terms apart instead, v_k = LN_g(g) + m_k · LN_r(λ v̂_k), and
``residual_scale`` λ scales v̂ before the sum (DVSE readings: where the LayerNorm sits, how the residual is scaled;
docs/methods/dvse.md).

The caller L2-normalises ``v``. ``v̂`` (the *residuals*) are returned too: PVSE's diversity loss and DVSE's
orthogonal constraint act on them. :func:`text_global_and_local` picks what a text encoder contributes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xmr.core.errors import XmrError
from xmr.models.pooling import POOLS, final_states_pool, last_pool, length_mask

ACTIVATIONS = {"sigmoid": torch.sigmoid, "relu": torch.relu, "tanh": torch.tanh}
#: where PIE-Net's LayerNorm sits: ``sum`` LN(g + v̂) (PVSE, DVSE's formula), ``per_term`` LN(g) + LN(v̂), ``none``
#: g + v̂ without a LayerNorm (VSE∞'s global branch has none: DVSE reduced to its base)
NORM_POSITIONS = ("sum", "per_term", "none")
#: the caption's global feature read from the text encoder's last hidden state, not pooled from its outputs
LAST_HIDDEN = "last_hidden"
#: what :func:`text_global_and_local` can take as a caption's global feature
TEXT_GLOBALS = (*POOLS, LAST_HIDDEN)


class MultiHeadSelfAttention(nn.Module):
    """K-head structured self-attention (Lin et al., ICLR'17): (B, R, F) -> pooled (B, K, F), attention (B, K, R)."""

    def __init__(self, num_heads: int, in_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(in_dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, num_heads, bias=False)
        nn.init.xavier_uniform_(self.w1.weight)
        nn.init.xavier_uniform_(self.w2.weight)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.w2(torch.tanh(self.w1(x))).transpose(1, 2)  # (B, K, R)
        valid = length_mask(lengths, x.shape[1])[:, None, :]
        attn = logits.masked_fill(~valid, float("-inf")).softmax(dim=-1)  # every sample has >= 1 valid position
        return attn @ x, attn


class PIENet(nn.Module):
    """Polysemous instance embedding: ``forward(global (B, D), local (B, R, F), lengths)`` -> dict with
    ``embeddings`` LN(g + gate·v̂) (B, K, D) (not yet L2-normalised), ``residuals`` v̂ (B, K, D) before the gate,
    ``attention`` (B, K, R)."""

    def __init__(self, num_embeds: int, in_dim: int, embed_dim: int, hidden_dim: int | None = None,
                 activation: str = "sigmoid", dropout: float = 0.0, layer_norm: bool = True, norm: str = "sum",
                 residual_scale: float = 1.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise XmrError(f"model.activation: {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        if norm not in NORM_POSITIONS:
            raise XmrError(f"model.layer_norm: {norm!r} is not one of {', '.join(NORM_POSITIONS)}")
        self.norm, self.residual_scale = norm, residual_scale
        self.num_embeds = num_embeds
        self.attention = MultiHeadSelfAttention(num_embeds, in_dim, hidden_dim or max(1, in_dim // 2))
        self.fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(embed_dim) if layer_norm and norm != "none" else nn.Identity()
        if norm == "per_term":  # a second LayerNorm for the residuals; the first one then normalises g alone
            self.residual_norm = nn.LayerNorm(embed_dim)

    def forward(self, global_feat: torch.Tensor, local: torch.Tensor, lengths: torch.Tensor,
                gate: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pooled, attn = self.attention(local, lengths)
        residuals = self.dropout(self.activation(self.fc(pooled)))  # (B, K, D)
        term = residuals * self.residual_scale if self.residual_scale != 1.0 else residuals
        if self.norm == "per_term":
            term = self.residual_norm(term)
        gated = term if gate is None else term * gate[..., None].to(residuals.dtype)
        if self.norm == "per_term":
            out = self.layer_norm(global_feat)[:, None, :] + gated
        else:
            out = self.layer_norm(global_feat[:, None, :] + gated)
        return {"embeddings": out, "residuals": residuals, "attention": attn}


def text_global_and_local(text_encoder: nn.Module, batch: dict[str, torch.Tensor], pool: str = "mean",
                          local: str = "hidden", dropout: nn.Module | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(global (B, D), local (B, T, F), lengths) from a text encoder's batch.

    ``pool``: how the global sentence vector is taken from the encoder's token outputs (``mean``, ``max``,
    ``last`` = output at the last word, PVSE; ``final``: see :func:`final_states_pool`) or from the encoder itself
    (``last_hidden``: the BiGRU's last hidden state, DivE). ``local``: what the attention heads read: ``hidden``
    (the encoder's token outputs, the DVSE formula's z_t) or ``words`` (the BiGRU's word embeddings, as PVSE and
    DivE's code do; BiGRU only). ``dropout`` (BiGRU only): on the word embeddings the GRU and ``words`` read, on
    the outputs and on the last hidden state, before any pooling (DivE's ``model.text_dropout``).
    """
    if dropout is not None:
        if not hasattr(text_encoder, "encode_words"):
            raise XmrError("model.text_dropout: needs the bigru text encoder (dropout on its word embeddings, "
                           "outputs and last hidden state); set it to 0 with other encoders")
        words, h, lengths, last = text_encoder.encode_words(batch, dropout)  # pool, local: schema enums
        glob = last if pool == LAST_HIDDEN else POOLS[pool](h, lengths)
        return glob, words if local == "words" else h, lengths
    if pool == LAST_HIDDEN:
        if not hasattr(text_encoder, "encode_with_last_hidden"):
            raise XmrError(f"model.text_pool: {LAST_HIDDEN} needs the bigru text encoder (a GRU's last hidden "
                           f"state); use mean or max with other encoders")
        h, lengths, glob = text_encoder.encode_with_last_hidden(batch)
    elif pool in POOLS:
        h, lengths = text_encoder(batch)
        glob = POOLS[pool](h, lengths)
    else:
        raise XmrError(f"model.text_pool: {pool!r} is not one of {', '.join(TEXT_GLOBALS)}")
    if local == "hidden":
        return glob, h, lengths
    if local == "words":
        if not hasattr(text_encoder, "embed") or "ids" not in batch:
            raise XmrError("model.text_attention_input: 'words' needs the bigru text encoder (word embeddings); "
                           "use 'hidden' with other encoders")
        return glob, text_encoder.embed(batch["ids"]), lengths
    raise XmrError(f"model.text_attention_input: {local!r} is not one of hidden, words")


def text_local_dim(text_encoder: nn.Module, local: str) -> int:
    """Width of the features :func:`text_global_and_local` returns as ``local``."""
    if local == "words":
        if not hasattr(text_encoder, "embed"):
            raise XmrError("model.text_attention_input: 'words' needs the bigru text encoder (word embeddings); "
                           "use 'hidden' with other encoders")
        return text_encoder.embed.embedding_dim
    return text_encoder.out_dim


class PIEImageHead(nn.Module):
    """Image side of PVSE/DVSE on precomputed local features (B, R, F): global g = FC(pool_r z) (PVSE: average
    pool + FC; DVSE's h_V), K PIE-Net embeddings, L2-normalised. ``forward`` returns PIENet's dict with
    ``embeddings`` normalised and ``global`` g added."""

    def __init__(self, in_dim: int, embed_dim: int, num_embeds: int, hidden_dim: int | None = None,
                 activation: str = "sigmoid", dropout: float = 0.0, pool: str = "mean", norm: str = "sum",
                 residual_scale: float = 1.0) -> None:
        super().__init__()
        if pool not in ("mean", "max"):
            raise XmrError(f"model.image_pool: {pool!r} is not one of mean, max")
        self.pool = POOLS[pool]
        self.global_fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.global_fc.weight)
        nn.init.zeros_(self.global_fc.bias)
        self.dropout = nn.Dropout(dropout)
        self.pie = PIENet(num_embeds, in_dim, embed_dim, hidden_dim, activation, dropout, norm=norm,
                          residual_scale=residual_scale)

    def forward(self, feats: torch.Tensor, num_regions: torch.Tensor,
                gate: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        g = self.dropout(self.global_fc(self.pool(feats, num_regions)))
        out = self.pie(g, feats, num_regions, gate)
        out["embeddings"] = F.normalize(out["embeddings"], dim=-1)
        out["global"] = g
        return out


class PIETextHead(nn.Module):
    """Caption side of PVSE/DVSE: global = pooled text-encoder outputs, K PIE-Net embeddings over ``local``
    (see :func:`text_global_and_local`), L2-normalised (B, K, D)."""

    def __init__(self, text_encoder: nn.Module, embed_dim: int, num_embeds: int, hidden_dim: int | None = None,
                 activation: str = "sigmoid", dropout: float = 0.0, pool: str = "mean",
                 local: str = "hidden", norm: str = "sum") -> None:
        super().__init__()
        if text_encoder.out_dim != embed_dim:
            raise XmrError(f"text encoder gives {text_encoder.out_dim}-d outputs, the joint space is {embed_dim}-d")
        self.pool_name, self.local = pool, local
        self.pie = PIENet(num_embeds, text_local_dim(text_encoder, local), embed_dim, hidden_dim, activation,
                          dropout, norm=norm)

    def forward(self, text_encoder: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        g, local, lengths = text_global_and_local(text_encoder, batch, self.pool_name, self.local)
        out = self.pie(g, local, lengths)
        out["embeddings"] = F.normalize(out["embeddings"], dim=-1)
        return out


__all__ = ["LAST_HIDDEN", "MultiHeadSelfAttention", "NORM_POSITIONS", "TEXT_GLOBALS", "PIENet", "PIEImageHead", "PIETextHead", "POOLS", "final_states_pool", "last_pool",
           "text_global_and_local", "text_local_dim"]
