"""VSE∞ (Chen et al., CVPR 2021): GPO pooling of projected local features for both modalities, VSE++ loss with a
warm-up of averaged hinges (VSE0) before the hardest negative (``vse_mean_warmup_epochs`` in woodfrog/vse_infty).

Also home of the training-time augmentations VSE∞ applies (and VSE+2AD / CODER inherit): random region/grid drop
("size augmentation") and caption token masking/replacement/deletion. They run inside the model, in training mode
only, so every method sharing the trainer can switch them on in its config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, RetrievalModel, strict_section
from xmr.models.gpo import GPO
from xmr.models.image import LocalProjection
from xmr.models.pooling import length_mask
from xmr.models.text import build_text_encoder

GPO_SCHEMA = strict_section({
    "pe_dim": {"type": "integer", "minimum": 2, "default": 32},
    "hidden_dim": {"type": "integer", "minimum": 1, "default": 32},
    "mlp_layers": {"enum": [1, 2], "default": 1,
                   "description": "score head: 1 = Linear(hidden, 1) (released code); 2 = two-layer MLP"},
    "temperature": {"type": "number", "exclusiveMinimum": 0, "default": 0.1},
})
GPO_SCHEMA["default"] = {}

SIZE_AUGMENT_SCHEMA = strict_section({
    "mode": {"enum": ["none", "region", "grid"], "default": "region",
             "description": "region: drop each region with prob p (VSE∞ precomputed regions); grid: with prob "
                            "1-p drop each cell with prob p·r, r ~ U(p, 1) (VSE∞ backbone grids)"},
    "p": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.2},
})
SIZE_AUGMENT_SCHEMA["default"] = {}

TEXT_AUGMENT_SCHEMA = {"type": "number", "minimum": 0, "maximum": 1, "default": 0.2,
                       "description": "per-token perturbation prob (then 50% mask, 10% random token, 40% delete); "
                                      "0 = off"}


# -- augmentation (training mode only) -------------------------------------------------------------------------
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


def drop_regions(feats: torch.Tensor, num_regions: torch.Tensor, mode: str = "region",
                 p: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """VSE∞ size augmentation: randomly drop local features, keeping at least one per image."""
    if mode == "none" or p == 0:
        return feats, num_regions
    b, r = feats.shape[:2]
    valid = length_mask(num_regions, r)
    u = torch.rand(b, r, device=feats.device)
    if mode == "region":
        keep = u > p
    else:  # grid: most images (prob 1-p) lose a random fraction of their cells, the rest keep all
        r2 = torch.rand(b, device=feats.device)
        keep = (u > p * r2[:, None]) | ~(r2 > p)[:, None]
    keep = keep & valid
    keep[:, 0] |= keep.sum(1) == 0
    return compact(feats, keep)


def augment_token_ids(ids: torch.Tensor, lengths: torch.Tensor, p: float, mask_id: int, random_low: int,
                      random_high: int, pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """VSE∞ caption augmentation on (B, T) token ids whose first and last valid tokens are boundary tokens
    (<start>/<end>, [CLS]/[SEP]): each inner token with prob ``p`` is masked (50%), replaced by a random id in
    [random_low, random_high) (10%) or deleted (40%)."""
    b, t = ids.shape
    pos = torch.arange(t, device=ids.device)[None, :]
    inner = (pos >= 1) & (pos < lengths[:, None] - 1)
    u = torch.rand(b, t, device=ids.device)
    hit = inner & (u < p)
    v = u / max(p, 1e-12)  # conditional draw, as the reference code (prob /= p)
    ids = torch.where(hit & (v < 0.5), torch.full_like(ids, mask_id), ids)
    rand_ids = torch.randint(random_low, random_high, ids.shape, device=ids.device)
    ids = torch.where(hit & (v >= 0.5) & (v < 0.6), rand_ids, ids)
    keep = (pos < lengths[:, None]) & ~(hit & (v >= 0.6))
    return compact(ids, keep, pad_id)


def augment_caption_batch(batch: dict, text_encoder, p: float) -> dict:
    """Token augmentation for the id-based text encoders (bigru: ``ids``; bert: ``input_ids``); others unchanged."""
    if p <= 0:
        return batch
    if "ids" in batch:  # BiGRU over the xmr vocabulary (no <mask> word: <unk> plays its role)
        from xmr.text.vocab import SPECIALS, UNK

        vocab = text_encoder.vocab
        ids, lengths = augment_token_ids(batch["ids"], batch["lengths"], p, vocab.index[UNK], len(SPECIALS),
                                         max(len(SPECIALS) + 1, len(vocab)))
        return {**batch, "ids": ids, "lengths": lengths}
    if "input_ids" in batch:
        tok = text_encoder.tokenizer
        lengths = batch["attention_mask"].sum(1)
        ids, lengths = augment_token_ids(batch["input_ids"], lengths, p, tok.mask_token_id, 0, len(tok),
                                         tok.pad_token_id or 0)
        mask = length_mask(lengths, ids.shape[1]).to(batch["attention_mask"].dtype)
        return {**batch, "input_ids": ids, "attention_mask": mask, "lengths": lengths}
    return batch


# -- the method ------------------------------------------------------------------------------------------------
@METHODS.register("vse_inf")
class VSEInfinity(RetrievalModel):
    schema = {
        "type": "object",
        "properties": {
            "model": strict_section({
                "embed_dim": {"type": "integer", "minimum": 1},
                "residual_mlp": {"type": "boolean", "default": True,
                                 "description": "FC + 2-layer MLP residual (region features); false = FC (grids)"},
                "gpo": GPO_SCHEMA,
                "size_augment": SIZE_AUGMENT_SCHEMA,
                "text_augment": TEXT_AUGMENT_SCHEMA,
            }),
            "loss": strict_section({
                "margin": {"type": "number", "minimum": 0, "default": 0.2},
                "warmup_epochs": {"type": "number", "minimum": 0, "default": 1,
                                  "description": "epochs of summed hinges (VSE0) before the hardest negative"},
                "reduction": {"enum": ["sum", "mean"], "default": "sum"},
            }),
        },
    }

    def __init__(self, cfg: dict, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(cfg, image_dim, vocab_words)
        m = cfg["model"]
        self.image_proj = LocalProjection(image_dim, self.embed_dim, m["residual_mlp"])
        self.image_pool = GPO(**m["gpo"])
        self.text = build_text_encoder(cfg["text"], self.embed_dim, vocab_words, cfg["train"]["seed"])
        self.text_pool = GPO(**m["gpo"])

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        if self.training:
            feats, num_regions = drop_regions(feats, num_regions, **self.cfg["model"]["size_augment"])
        return F.normalize(self.image_pool(self.image_proj(feats), num_regions), dim=-1)

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.training:
            batch = augment_caption_batch(batch, self.text, self.cfg["model"]["text_augment"])
        h, lengths = self.text(batch)
        return F.normalize(self.text_pool(h, lengths), dim=-1)

    def compute_loss(self, img, txt, pos_mask, epoch):
        loss_cfg = self.cfg["loss"]
        hardest = epoch >= loss_cfg["warmup_epochs"]
        loss = triplet_loss(img @ txt.t(), pos_mask, loss_cfg["margin"], hardest, loss_cfg["reduction"])
        return {"loss": loss, "max_violation": torch.tensor(float(hardest))}
