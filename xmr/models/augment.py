"""Training-time augmentations that run inside a model, in training mode only (never at evaluation).

One home for the feature- and token-level augmentations of the reference codes, so every method sharing the
trainer switches them on in its config (``model.size_augment``, ``model.text_augment``,
``model.text_augment_style``):

- **size augmentation** (:func:`drop_regions`, :func:`region_keep_mask`) on the (B, R, F) local features:
  ``region``: each region dropped independently with prob p (VSE∞ and DivE precomputed-region loaders);
  ``count``: exactly ⌊p·n⌋ of an image's n regions dropped (DivE's paper wording "drop 20% of ROIs");
  ``grid``: VSE∞'s backbone-grid drop. At least one element per image is always kept.
- **caption token augmentation** (:func:`augment_caption_batch`) on the text encoder's id batch; the boundary
  tokens (<start>/<end>, [CLS]/[SEP]) are never touched. Styles (:data:`TEXT_AUGMENT_STYLES`):
  ``mask_random_delete`` (VSE∞ and DivE code): each inner token with prob p is masked (50%), replaced by a
  random token (10%) or deleted (40%); ``delete`` (DivE paper "drop 20% of words"): each inner token deleted
  with prob p; ``unk_then_delete`` (PCME code): each inner token becomes <unk> with prob p, then ⌊p·n⌋ of the
  n inner tokens, drawn uniformly, are deleted.

Every random draw takes an optional ``generator`` (default: the global RNG).
"""

from __future__ import annotations

import torch

from xmr.core.errors import XmrError
from xmr.models.pooling import length_mask

SIZE_AUGMENT_MODES = ("none", "region", "count", "grid")
TEXT_AUGMENT_STYLES = ("mask_random_delete", "delete", "unk_then_delete")


def _rand(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
    if generator is None:
        return torch.rand(shape, device=device)
    return torch.rand(shape, generator=generator, device=generator.device).to(device)


def compact(x: torch.Tensor, keep: torch.Tensor, pad_value: float = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the kept entries of each row of ``x`` (B, T, ...) to the front (order preserved), pad the rest with
    ``pad_value`` and trim to the longest row. Returns (x, lengths)."""
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices
    n = keep.sum(1)
    t = max(1, int(n.max()))
    order = order[:, :t]
    idx = order.reshape(*order.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    out = x.gather(1, idx)
    valid = length_mask(n, t).reshape(*order.shape, *([1] * (x.dim() - 2)))
    return out.masked_fill(~valid, pad_value), n


def _random_subset(candidates: torch.Tensor, count: torch.Tensor,
                   generator: torch.Generator | None) -> torch.Tensor:
    """(B, T) bool: ``count[b]`` entries of row b drawn uniformly among its True ``candidates``."""
    score = _rand(tuple(candidates.shape), candidates.device, generator).masked_fill(~candidates, 2.0)
    rank = score.argsort(dim=1).argsort(dim=1)  # rank of each entry in a random order of the candidates
    return candidates & (rank < count[:, None])


def region_keep_mask(num_regions: torch.Tensor, max_regions: int, mode: str = "region", p: float = 0.2,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, R) bool: which local features survive the size augmentation (module docstring); at least one per
    image, never a padded position."""
    valid = length_mask(num_regions, max_regions)
    if mode == "none" or p == 0:
        return valid
    b, r = valid.shape
    if mode == "region":
        keep = _rand((b, r), valid.device, generator) > p
    elif mode == "count":
        drop = torch.floor(num_regions.to(torch.float64) * p).to(num_regions.dtype)
        keep = ~_random_subset(valid, drop, generator)
    elif mode == "grid":  # most images (prob 1-p) lose a random fraction of their cells, the rest keep all
        u = _rand((b, r), valid.device, generator)
        r2 = _rand((b,), valid.device, generator)
        keep = (u > p * r2[:, None]) | ~(r2 > p)[:, None]
    else:
        raise XmrError(f"model.size_augment.mode: {mode!r} is not one of {', '.join(SIZE_AUGMENT_MODES)}")
    keep = keep & valid
    keep[:, 0] |= keep.sum(1) == 0
    return keep


def drop_regions(feats: torch.Tensor, num_regions: torch.Tensor, mode: str = "region", p: float = 0.2,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Size augmentation: drop local features of (B, R, F) ``feats``; returns the compacted (features, counts)."""
    if mode == "none" or p == 0:
        return feats, num_regions
    return compact(feats, region_keep_mask(num_regions, feats.shape[1], mode, p, generator))


def augment_token_ids(ids: torch.Tensor, lengths: torch.Tensor, p: float, mask_id: int, random_low: int,
                      random_high: int, pad_id: int = 0, style: str = "mask_random_delete",
                      generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption augmentation on (B, T) token ids whose first and last valid tokens are boundary tokens.

    ``style`` (module docstring): ``mask_random_delete`` masks with ``mask_id`` / replaces by a random id in
    [random_low, random_high) / deletes; ``delete`` deletes; ``unk_then_delete`` sets ``mask_id`` (the <unk>
    id) then deletes ⌊p·n⌋ random inner tokens. Returns the compacted (ids, lengths).
    """
    if style not in TEXT_AUGMENT_STYLES:
        raise XmrError(f"model.text_augment_style: {style!r} is not one of {', '.join(TEXT_AUGMENT_STYLES)}")
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device)[None, :]
    inner = (pos >= 1) & (pos < lengths[:, None] - 1)
    u = _rand((b, t), ids.device, generator)
    hit = inner & (u < p)
    valid = pos < lengths[:, None]
    if style == "unk_then_delete":
        ids = torch.where(hit, torch.full_like(ids, mask_id), ids)
        n_inner = (lengths - 2).clamp(min=0)
        drop = torch.floor(n_inner.to(torch.float64) * p).to(lengths.dtype)
        return compact(ids, valid & ~_random_subset(inner, drop, generator), pad_id)
    if style == "delete":
        return compact(ids, valid & ~hit, pad_id)
    v = u / max(p, 1e-12)  # conditional draw within the hit tokens, as the reference code (prob /= p)
    ids = torch.where(hit & (v < 0.5), torch.full_like(ids, mask_id), ids)
    if generator is None:
        rand_ids = torch.randint(random_low, random_high, ids.shape, device=ids.device)
    else:
        rand_ids = torch.randint(random_low, random_high, ids.shape, generator=generator,
                                 device=generator.device).to(ids.device)
    ids = torch.where(hit & (v >= 0.5) & (v < 0.6), rand_ids, ids)
    return compact(ids, valid & ~(hit & (v >= 0.6)), pad_id)


def augment_caption_batch(batch: dict, text_encoder, p: float, style: str = "mask_random_delete",
                          generator: torch.Generator | None = None) -> dict:
    """Token augmentation for the id-based text encoders (bigru: ``ids``; bert: ``input_ids``); others unchanged.

    The mask token is <unk> for the BiGRU vocabulary (it has no <mask> word) and [MASK] for BERT; the
    ``unk_then_delete`` style uses <unk> / [UNK].
    """
    if p <= 0:
        return batch
    if "ids" in batch:  # BiGRU over the xmr vocabulary
        from xmr.text.vocab import SPECIALS, UNK

        vocab = text_encoder.vocab
        ids, lengths = augment_token_ids(batch["ids"], batch["lengths"], p, vocab.index[UNK], len(SPECIALS),
                                         max(len(SPECIALS) + 1, len(vocab)), style=style, generator=generator)
        return {**batch, "ids": ids, "lengths": lengths}
    if "input_ids" in batch:
        tok = text_encoder.tokenizer
        lengths = batch["attention_mask"].sum(1)
        mask_id = tok.unk_token_id if style == "unk_then_delete" else tok.mask_token_id
        ids, lengths = augment_token_ids(batch["input_ids"], lengths, p, mask_id, 0, len(tok),
                                         tok.pad_token_id or 0, style=style, generator=generator)
        mask = length_mask(lengths, ids.shape[1]).to(batch["attention_mask"].dtype)
        return {**batch, "input_ids": ids, "attention_mask": mask, "lengths": lengths}
    return batch


__all__ = ["SIZE_AUGMENT_MODES", "TEXT_AUGMENT_STYLES", "compact", "region_keep_mask", "drop_regions", "augment_token_ids",
           "augment_caption_batch"]
