"""Random-initialised transformers towers at toy size, saved with ``save_pretrained`` (model, image processor and,
for dual encoders, a letter-level WordPiece tokenizer) into a local folder: what the tests and the synth demo run
in place of downloaded weights. They go through exactly the loading path of a real checkpoint folder."""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from pathlib import Path

#: family -> what the folder holds (the ``transformers`` class names)
FAMILIES = ("vit", "clip", "clip_vision", "siglip", "siglip_vision", "dinov2")
#: the tokenizer's vocabulary: BERT's special tokens, then letters (a word is spelt letter by letter)
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(string.ascii_lowercase)
         + [f"##{c}" for c in string.ascii_lowercase])


def _tokenizer(folder: Path) -> None:
    from transformers import BertTokenizer

    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    BertTokenizer(str(vocab)).save_pretrained(folder)


def save_tiny_tower(family: str, folder: str | Path, image_size: int = 32, patch_size: int = 8, hidden: int = 32,
                    layers: int = 2, seed: int = 0, heads: int = 2, mlp_ratio: int = 2) -> Path:
    """A ``family`` model (:data:`FAMILIES`) with ``layers`` layers of width ``hidden`` at ``image_size`` px and its
    image processor (square resize for ViT and SigLIP; shorter side + crop for CLIP and DINOv2) in ``folder``.
    ``hidden=768, layers=12, heads=12, mlp_ratio=4, image_size=224, patch_size=16``: a base-size tower (benchmarks)."""
    import torch
    import transformers as tf
    from transformers.utils import logging

    logging.disable_progress_bar()
    final = Path(folder)
    final.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))  # renamed into place when complete
    torch.manual_seed(seed)
    vision = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=mlp_ratio * hidden, image_size=image_size, patch_size=patch_size)
    text = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=mlp_ratio * hidden,
                vocab_size=len(VOCAB), max_position_embeddings=32, pad_token_id=0, bos_token_id=VOCAB.index("[CLS]"),
                eos_token_id=VOCAB.index("[SEP]"))
    square = {"height": image_size, "width": image_size}
    if family == "vit":
        model, proc = tf.ViTModel(tf.ViTConfig(**vision)), tf.ViTImageProcessor(size=square)
    elif family == "dinov2":  # DINOv2's processor: shorter side, then the central 0.875 (256 -> 224)
        model = tf.Dinov2Model(tf.Dinov2Config(**vision))
        proc = tf.BitImageProcessor(size={"shortest_edge": round(image_size / 0.875)}, crop_size=square)
    elif family.startswith("clip"):
        proc = tf.CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size=square)
        model = (tf.CLIPVisionModel(tf.CLIPVisionConfig(**vision)) if family == "clip_vision" else
                 tf.CLIPModel(tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=hidden)))
    elif family.startswith("siglip"):
        proc = tf.SiglipImageProcessor(size=square)
        model = (tf.SiglipVisionModel(tf.SiglipVisionConfig(**vision)) if family == "siglip_vision" else
                 tf.SiglipModel(tf.SiglipConfig(text_config=text, vision_config=vision)))
    else:
        shutil.rmtree(folder)
        raise ValueError(f"family {family!r}: one of {', '.join(FAMILIES)}")
    model.save_pretrained(folder)
    proc.save_pretrained(folder)
    if family in ("clip", "siglip"):
        _tokenizer(folder)
    if final.exists():
        shutil.rmtree(final)
    os.replace(folder, final)
    return final
