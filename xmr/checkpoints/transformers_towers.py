"""A CLIP-style dual encoder saved by ``transformers`` (a local ``CLIPModel`` / ``SiglipModel`` folder, ``--src``
the folder), onto xmr's ``clip`` method, untrained: the zero-shot run (docs/methods/clip.md).

The run keeps the text tower, the image head and the logit scale (:func:`xmr.models.dual_encoder.dual_encoder_parts`,
whose keys are the method's); the vision trunk is the run's ``transformers`` backbone, whose tokens ``xmr extract``
writes (recipe ``features.backbone``, the same folder as its ``weights:``).
"""

from __future__ import annotations

from pathlib import Path

from xmr.checkpoints.base import CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel


def read_transformers(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    from xmr.models.dual_encoder import dual_encoder_parts

    parts = dual_encoder_parts(src)
    cfg = parts["text"].model.config
    return ImportedModel(
        method="clip", config={"model": {"path": str(src), "embed_dim": parts["text"].embed_dim}},
        state_dict=dict(parts.state_dict()), image_dim=parts["image_head"].in_dim, vocab_words=None,
        provenance={"model_type": parts["image_head"].kind, "text_hidden_size": int(cfg.hidden_size),
                    "embed_dim": parts["text"].embed_dim})


CHECKPOINT_FORMATS.register("transformers")(CheckpointFormat(
    name="transformers", read=read_transformers, directory=True,
    published_at="the model's page of its publisher (e.g. openai/clip-vit-base-patch16, "
                 "google/siglip-base-patch16-224), saved with save_pretrained",
    description="a CLIPModel or SiglipModel folder written by save_pretrained: the zero-shot dual encoder"))
