"""The interface every method implements, and the method registry."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch
from torch import nn

from xmr.registry import Registry

METHODS: Registry[type["RetrievalModel"]] = Registry("method")


def strict_section(properties: dict[str, Any], required: list[str] | None = None) -> dict:
    """JSON-schema object with the given properties and nothing else (catches misspelt keys)."""
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = required
    return out


class RetrievalModel(nn.Module):
    """A dual encoder trained by :mod:`xmr.train.trainer` and evaluated by :mod:`xmr.evaluation`.

    Subclasses set ``schema`` (JSON schema for their ``model``/``loss`` config sections, with defaults) and
    implement ``encode_image``, ``encode_text`` and ``compute_loss``. Embeddings are (B, D) or sets (B, K, D);
    ``eval_similarity`` names the :mod:`xmr.similarity` measure used to compare them at test time.
    """

    schema: ClassVar[dict] = {}
    # True when compute_loss is a function of (img, txt, pos_mask), the per-pair tensors gather_aux gathers and
    # parameters only, so that DDP can gather every process's pairs into one global batch (train.gather_negatives)
    gathered_loss: ClassVar[bool] = False
    # config sections that make the method small enough for the registry's conformance test at toy size (48
    # training images, embeddings of 32; tests/test_method_conformance.py); a new method sets what it needs
    conformance_overrides: ClassVar[dict] = {}

    def __init__(self, cfg: dict, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_dim = cfg["model"]["embed_dim"]
        # dataset image indices of the current training batch, set by the trainer before each forward (memory
        # banks use them to recognise entries of the same image); None outside the trainer
        self.batch_image_index: torch.Tensor | None = None
        # end-to-end training (features.source: images): the trainer attaches an xmr.models.image_backbone.FinetunedBackbone
        self.image_backbone: nn.Module | None = None

    # -- encoders ---------------------------------------------------------------------------------
    def image_local_features(self, image_input: torch.Tensor,
                             num_regions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R, F) local features + (B,) counts: precomputed features pass through; with an image backbone
        (end to end), ``image_input`` is uint8 pixels (B, 3, H, W) and goes through it."""
        if self.image_backbone is None:
            return image_input, num_regions
        return self.image_backbone(image_input)

    def embed_images(self, image_input: torch.Tensor, num_regions: torch.Tensor | None) -> torch.Tensor:
        """Image embeddings from a batch as the data loaders give it (features or pixels)."""
        return self.encode_image(*self.image_local_features(image_input, num_regions))

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, feats: torch.Tensor, num_regions: torch.Tensor, text: dict[str, torch.Tensor]):
        """Both encoders in one call (one forward per backward, as DistributedDataParallel expects)."""
        return self.encode_image(feats, num_regions), self.encode_text(text)

    # -- training ---------------------------------------------------------------------------------
    def compute_loss(self, img: torch.Tensor, txt: torch.Tensor, pos_mask: torch.Tensor,
                     epoch: float) -> dict[str, torch.Tensor]:
        """Return a dict with the total ``loss`` and any named terms (logged separately)."""
        raise NotImplementedError

    def prepare(self, train_split) -> None:
        """Hook the trainer calls once with the training split (:class:`~xmr.data.base.CaptionedSplit`) before
        training starts: data-dependent state (CODER's concept vocabulary) is built here, so no method reads
        data on its own. Default: nothing."""

    def on_train_step_end(self) -> None:
        """Hook for momentum encoders, queues, ... (called after each optimizer step)."""

    def gather_aux(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """With ``train.gather_negatives``, after the embeddings are gathered: the per-pair tensors the forward
        kept for the loss (``self._aux``: residuals, slots, masks; rows = the local batch) gathered the same way,
        so that regularisers over them see the global batch too (DVSE, PVSE, DivE). Default: any tensor in
        ``_aux``."""
        aux = getattr(self, "_aux", None)
        if aux:
            self._aux = {k: gather(v) if torch.is_tensor(v) else v for k, v in aux.items()}

    # -- evaluation -------------------------------------------------------------------------------
    @property
    def eval_similarity(self) -> str:
        return self.cfg["eval"]["similarity"]

    def similarity_matrix(self, img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        """(N, M) image-caption scores for evaluation (chunked inside xmr.similarity)."""
        from xmr.similarity import compute_similarity

        return compute_similarity(img, txt, measure=self.eval_similarity, alpha=self.cfg["eval"]["alpha"])

    def param_groups(self, lr: float, backbone_scale: float) -> list[dict]:
        """Optimizer groups: pretrained text-encoder weights get ``lr * backbone_scale``."""
        pre = getattr(getattr(self, "text", None), "pretrained_params", [])
        slow, fast = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (slow if any(name.startswith(f"text.{q}") for q in pre) else fast).append(p)
        groups = [{"params": fast, "lr": lr, "name": "main"}]
        if slow:
            groups.append({"params": slow, "lr": lr * backbone_scale, "name": "text_backbone"})
        return groups

    def with_image_backbone_group(self, groups: list[dict], lr: float) -> list[dict]:
        """``groups`` (from :meth:`param_groups`, possibly a subclass's) with the end-to-end image backbone's
        parameters moved into their own group ``image_backbone`` at ``lr``; unchanged without a backbone."""
        if self.image_backbone is None:
            return groups
        mine = [p for p in self.image_backbone.parameters() if p.requires_grad]
        ids = {id(p) for p in mine}
        rest = [{**g, "params": [p for p in g["params"] if id(p) not in ids]} for g in groups]
        return [g for g in rest if g["params"]] + [{"params": mine, "lr": lr, "name": "image_backbone"}]
