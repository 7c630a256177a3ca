"""VSE++ (Faghri et al., BMVC'18): FC image projection + mean pooling, BiGRU text, hardest-negative triplet."""

from __future__ import annotations

import torch.nn.functional as F

from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, RetrievalModel, strict_section
from xmr.models.image import LocalProjection
from xmr.models.pooling import last_pool, max_pool, mean_pool
from xmr.models.text import build_text_encoder

POOLS = {"mean": mean_pool, "max": max_pool, "last": last_pool}  # last: the released code's GRU read (text)


@METHODS.register("vsepp")
class VSEPP(RetrievalModel):
    gathered_loss = True  # the loss reads only (img, txt, pos_mask): DDP may gather the global batch
    schema = {
        "type": "object",
        "properties": {
            "model": strict_section({
                "embed_dim": {"type": "integer", "minimum": 1},
                "residual_mlp": {"type": "boolean", "default": False},
                "image_pool": {"enum": list(POOLS), "default": "mean"},
                "text_pool": {"enum": list(POOLS), "default": "mean"},
                # no default, so that the recipes' resolved configs stay as they were: absent = regions
                "image_encoder": {"enum": ["regions", "full_image"],
                                  "description": "regions (absent): fc on every region, then image_pool; "
                                                 "full_image: VSE++'s EncoderImageFull on a backbone's output: "
                                                 "image_pool first (the CNN's avgpool), l2-normalise the pooled "
                                                 "vector, then fc (imported full-image checkpoints)"},
            }),
            "loss": strict_section({
                "margin": {"type": "number", "minimum": 0, "default": 0.2},
                "max_violation": {"type": "boolean", "default": True,
                                  "description": "hardest negative (VSE++); false = sum of hinges (VSE0)"},
                "reduction": {"enum": ["sum", "mean"], "default": "sum"},
                "warmup_epochs": {"type": "number", "minimum": 0, "default": 0,
                                  "description": "sum of hinges before this epoch, then hardest negative "
                                                 "(VSE∞'s vse_mean_warmup_epochs; avoids early collapse)"},
            }),
        },
    }

    def __init__(self, cfg, image_dim, vocab_words):
        super().__init__(cfg, image_dim, vocab_words)
        m = cfg["model"]
        self.image_proj = LocalProjection(image_dim, self.embed_dim, m["residual_mlp"])
        self.text = build_text_encoder(cfg["text"], self.embed_dim, vocab_words, cfg["train"]["seed"])
        self.image_pool, self.text_pool = POOLS[m["image_pool"]], POOLS[m["text_pool"]]
        self.full_image = m.get("image_encoder", "regions") == "full_image"

    def encode_image(self, feats, num_regions):
        if self.full_image:  # l2norm(fc(l2norm(cnn(x)))): the normalisation sits between pooling and fc
            pooled = F.normalize(self.image_pool(feats, num_regions), dim=-1)
            return F.normalize(self.image_proj(pooled.unsqueeze(1)).squeeze(1), dim=-1)
        return F.normalize(self.image_pool(self.image_proj(feats), num_regions), dim=-1)

    def encode_text(self, batch):
        h, lengths = self.text(batch)
        return F.normalize(self.text_pool(h, lengths), dim=-1)

    def compute_loss(self, img, txt, pos_mask, epoch):
        loss_cfg = self.cfg["loss"]
        hardest = loss_cfg["max_violation"] and epoch >= loss_cfg["warmup_epochs"]
        loss = triplet_loss(img @ txt.t(), pos_mask, loss_cfg["margin"], hardest, loss_cfg["reduction"])
        return {"loss": loss}
