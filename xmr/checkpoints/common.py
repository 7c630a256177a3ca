"""Pieces the PVSE-family formats (PVSE, PCME) share: option parsing, the reference vocabulary in xmr's order,
the torchvision ResNet trunk of a full-image model mapped onto xmr's end-to-end backbone."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import torch

from xmr.core.errors import XmrError
from xmr.features.backbones import TRUNK_INDEX
from xmr.text.vocab import SPECIALS

# the reference vocabulary pickles (PVSE/VSE++ ``vocab.py``): the class as pickled by ``python vocab.py`` or imported
REFERENCE_VOCAB_CLASSES = [("vocab", "Vocabulary"), ("__main__", "Vocabulary"), ("data", "Vocabulary")]

# the reference's caption tokens (PVSE data.py, PCME datasets/_transforms.py: nltk word_tokenize(caption.lower()),
# <start> ... <end>, never truncated)
REFERENCE_TOKENS = {"tokenizer": "nltk", "max_len": 512}
# torchvision ResNet: blocks in layer3 -> architecture, and the xmr backbone key it runs as (config/backbones.yaml:
# ResNet-152 preprocessed exactly as torchvision's Resize(256) + CenterCrop(224), the reference's test transform)
RESNET_BY_LAYER3 = {36: ("resnet152", "resnet152_224_torchvision")}


def option(options: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    """A format option given as text on the command line (``--option num_embeds=2``) or as YAML data."""
    if name not in options or options[name] is None:
        return default
    value = options[name]
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
    elif kind is int:
        try:
            return int(str(value))
        except ValueError:
            pass
    else:
        return kind(value)
    raise XmrError(f"--option {name}={value}: expected {'true/false' if kind is bool else 'an integer'}")


def check_options(options: Mapping[str, Any], known: tuple[str, ...], fmt: str) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise XmrError(f"--option {unknown[0]}: not an option of --format {fmt}; its options are {', '.join(known)}")


def reference_vocab_words(path: Path) -> list[str]:
    """The words of a reference vocabulary by index: a pickled ``Vocabulary`` (``word2idx``) or a plain
    ``word2idx`` dict pickle (PCME's ``datasets/vocabs/coco_vocab.pkl``)."""
    from xmr.checkpoints.base import load_plain_pickle

    obj = load_plain_pickle(path, REFERENCE_VOCAB_CLASSES)
    word2idx = obj if isinstance(obj, dict) else getattr(obj, "word2idx", None)
    if not isinstance(word2idx, dict) or not word2idx:
        raise XmrError(f"{path}: no word2idx in this vocabulary pickle; pass the reference's vocab/*.pkl")
    return words_by_index(word2idx, path)


def words_by_index(word2idx: Mapping[str, int], src: Any) -> list[str]:
    """``word2idx`` -> the list of words by index (indices must be 0..n-1)."""
    words: list[str | None] = [None] * len(word2idx)
    for w, i in word2idx.items():
        if not isinstance(i, int) or not 0 <= i < len(words) or words[i] is not None:
            raise XmrError(f"{src}: word2idx index {i!r} of {w!r} is not a distinct index 0..{len(words) - 1}")
        words[i] = w
    return words  # type: ignore[return-value]


def to_xmr_vocab(ref_words: list[str], embed: torch.Tensor, src: Any, embed_key: str
                 ) -> tuple[list[str], torch.Tensor]:
    """xmr's vocabulary (specials ``<pad> <unk> <start> <end>`` first, the other words in the reference's order)
    and the embedding rows permuted to match. The reference orders its specials ``<pad> <start> <end> <unk>``."""
    if len(ref_words) != embed.shape[0]:
        raise XmrError(f"{src}: the vocabulary has {len(ref_words)} words but {embed_key} has {embed.shape[0]} rows; "
                       f"pass the vocabulary this checkpoint was trained with")
    missing = [s for s in SPECIALS if s not in ref_words]
    if missing:
        raise XmrError(f"{src}: the vocabulary lacks {', '.join(missing)}; is it the reference's vocabulary?")
    index = {w: i for i, w in enumerate(ref_words)}
    words = SPECIALS + [w for w in ref_words if w not in SPECIALS]
    return words, embed[torch.tensor([index[w] for w in words])]


def resnet_trunk(state: Mapping[str, torch.Tensor], prefix: str, src: Any) -> tuple[dict[str, torch.Tensor], str]:
    """The torchvision ResNet under ``prefix`` (``img_enc.cnn.``) as xmr's ``image_backbone.net.trunk.*`` keys, and
    the backbone key of config/backbones.yaml it runs as. The classifier ``fc`` is absent (the reference replaces
    it by an empty Sequential)."""
    cnn = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    blocks = {int(k.split(".")[1]) for k in cnn if k.startswith("layer3.")}
    arch = RESNET_BY_LAYER3.get(len(blocks))
    if arch is None or "layer1.0.conv3.weight" not in cnn:
        raise XmrError(f"{src}: {prefix}* is not a ResNet-152 (layer3 has {len(blocks)} blocks, not 36); the "
                       f"released COCO models of this format use --cnn_type resnet152")
    out = {}
    for k, v in cnn.items():
        head, _, rest = k.partition(".")
        if head not in TRUNK_INDEX:
            raise XmrError(f"{src}: unexpected key {prefix}{k} in the image CNN")
        out[f"image_backbone.net.trunk.{TRUNK_INDEX[head]}.{rest}"] = v
    return out, arch[1]


def float32_state(state: Mapping[str, Any], src: Any) -> dict[str, torch.Tensor]:
    """Tensors as float32 (apex O2 saves float16); integer buffers (BN's num_batches_tracked) unchanged."""
    out = {}
    for k, v in state.items():
        if not torch.is_tensor(v):
            raise XmrError(f"{src}: {k} is a {type(v).__name__}, not a tensor; is this a model state dict?")
        out[k] = v.float() if v.is_floating_point() else v
    return out


def take_image_cnn(state: dict[str, torch.Tensor], options: Mapping[str, Any], src: Any
                   ) -> tuple[dict[str, torch.Tensor], dict, str, int]:
    """Removes the reference's CNN (``img_enc.cnn.*``) from ``state`` and returns what the run gets instead, by the
    ``image_input`` option: ``images`` (default) keeps it as xmr's end-to-end backbone; ``features`` drops it for
    precomputed grids of the same preprocessing. Returns (backbone state, ``features`` config, image_input,
    number of CNN keys)."""
    image_input = option(options, "image_input", str, "images")
    if image_input not in ("images", "features"):
        raise XmrError(f"--option image_input={image_input}: choose images (the checkpoint's CNN) or features")
    prefix = "img_enc.cnn."
    cnn_keys = [k for k in state if k.startswith(prefix)]
    trunk: dict[str, torch.Tensor] = {}
    if image_input == "images":
        if not cnn_keys:
            raise XmrError(f"{src}: no {prefix}* weights; import it with --option image_input=features")
        trunk, backbone = resnet_trunk(state, prefix, src)
        features = {"source": "images", "backbone": backbone}
    else:
        features = {"source": "precomputed", "backbone": RESNET_BY_LAYER3[36][1]}
    for key in cnn_keys:
        del state[key]
    return trunk, features, image_input, len(cnn_keys)
