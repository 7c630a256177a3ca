"""``--format pvse``: the released COCO models of yalesong/pvse (``coco_pvse_k1.pth``, ``coco_pvse.pth``).

The file is the bare ``state_dict`` of ``model.PVSE`` (``eval.py``: ``model.load_state_dict(torch.load(ckpt))``),
keys ``img_enc.*``/``txt_enc.*``, with ``module.`` in front when it was saved from DataParallel; a training
checkpoint ``{'args', 'epoch', 'best_score', 'model'}`` (``train.py``) is read too. The architecture is not in
the file: it comes from the flags of the README's eval command, given as options (``--option num_embeds=2``):

- ``num_embeds`` (K; README: 1 or 2; default: the rows of ``pie_net.attention.w_2``, checked when given);
- ``img_attention``/``txt_attention`` (README: on; xmr's PVSE always has the PIE heads);
- ``legacy`` (README: on): the sentence vector is the BiGRU output at position len - 1 (``text_pool: last``);
  off: the GRU's final states (``text_pool: final``);
- ``image_input``: ``images`` (default) runs the checkpoint's own ResNet (``img_enc.cnn.*``) end to end, as the
  reference does (its BatchNorm statistics moved in training even with the CNN frozen); ``features`` drops the
  CNN and reads precomputed ``resnet152_224_torchvision`` grids instead.

Reference -> xmr: ``txt_enc.rnn`` is a BiGRU of width D/2 per direction, concatenated
(``text.bigru_directions: concat``); the PIE heads read the word embeddings; ``w_1``/``w_2`` -> ``w1``/``w2``;
the embedding rows are permuted into xmr's vocabulary order. The vocabulary is the pickled ``Vocabulary``
(``vocab/coco_vocab.pkl``, 11,755 words), read without running pickle code.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from xmr.checkpoints.base import CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel, load_official, strip_prefix
from xmr.checkpoints.common import (REFERENCE_TOKENS, check_options, float32_state, option, reference_vocab_words,
                                    take_image_cnn, to_xmr_vocab)
from xmr.core.errors import XmrError

OPTIONS = ("num_embeds", "img_attention", "txt_attention", "legacy", "image_input")
# reference PIENet / MultiHeadSelfAttention names -> xmr's
PIE_NAMES = {"attention.w_1.": "attention.w1.", "attention.w_2.": "attention.w2.", "fc.": "fc.",
             "layer_norm.": "layer_norm."}


def model_state(obj, src: Path) -> dict[str, torch.Tensor]:
    """The model state dict of a PVSE file: bare, or under ``'model'`` (train.py); ``module.`` stripped."""
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict) or not obj:
        raise XmrError(f"{src}: not a PVSE checkpoint (expected a state dict of img_enc.*/txt_enc.* tensors)")
    state = strip_prefix(obj, "module.")
    if not any(k.startswith("txt_enc.") for k in state) or not any(k.startswith("img_enc.") for k in state):
        raise XmrError(f"{src}: not a PVSE checkpoint (no img_enc.*/txt_enc.* keys; found e.g. "
                       f"{', '.join(sorted(state)[:3])}); check --format")
    return float32_state(state, src)


def _pie(state: dict, ref_prefix: str, xmr_prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for k in [k for k in state if k.startswith(ref_prefix)]:
        rest = k[len(ref_prefix):]
        for ref, new in PIE_NAMES.items():
            if rest.startswith(ref):
                out[xmr_prefix + new + rest[len(ref):]] = state.pop(k)
                break
    return out


def _flag_check(state: dict, prefix: str, flag: str, on: bool, src: Path) -> None:
    has = any(k.startswith(prefix) for k in state)
    if on and not has:
        raise XmrError(f"{src}: --option {flag}=true but the checkpoint has no {prefix}* weights; set {flag}=false")
    if not on:
        what = "this checkpoint has them: drop the option" if has else "this model is not representable"
        raise XmrError(f"{src}: --option {flag}=false: xmr's pvse always has the PIE heads (the README's COCO "
                       f"models use --img_attention --txt_attention); {what}")


def read_pvse(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    check_options(options, OPTIONS, "pvse")
    obj = load_official(src, [argparse.Namespace])
    state = model_state(obj, src)
    legacy = option(options, "legacy", bool, True)
    _flag_check(state, "img_enc.pie_net.", "img_attention", option(options, "img_attention", bool, True), src)
    _flag_check(state, "txt_enc.pie_net.", "txt_attention", option(options, "txt_attention", bool, True), src)

    try:
        fc_w, embed = state["img_enc.fc.weight"], state["txt_enc.embed.weight"]
        w2_img, w2_txt = state["img_enc.pie_net.attention.w_2.weight"], state["txt_enc.pie_net.attention.w_2.weight"]
    except KeyError as e:
        raise XmrError(f"{src}: missing key {e.args[0]}; is this a PVSE image model (not a video model)?") from None
    embed_dim, image_dim = fc_w.shape
    word_dim = embed.shape[1]
    k_weights = w2_img.shape[0]
    k = option(options, "num_embeds", int, k_weights)
    if k != k_weights or w2_txt.shape[0] != k_weights:
        raise XmrError(f"{src}: --option num_embeds={k} does not fit the checkpoint: its attention heads have "
                       f"{k_weights} (image) and {w2_txt.shape[0]} (caption) rows; set num_embeds={k_weights}")
    gru = state.get("txt_enc.rnn.weight_hh_l0")
    if gru is None or gru.shape[1] * 2 != embed_dim:
        raise XmrError(f"{src}: txt_enc.rnn is not a BiGRU of width embed_size/2 = {embed_dim // 2}; "
                       f"is this a PVSE checkpoint?")

    if vocab is None:
        raise XmrError(f"{src}: --format pvse needs --vocab (the reference's vocab/coco_vocab.pkl)")
    words, embed_rows = to_xmr_vocab(reference_vocab_words(vocab), embed, vocab, "txt_enc.embed.weight")

    out: dict[str, torch.Tensor] = {}
    cfg: dict = {
        "model": {"embed_dim": int(embed_dim), "num_embeds": int(k), "text_pool": "last" if legacy else "final",
                  "text_attention_input": "words", "image_pool": "mean", "attention_hidden": None,
                  "activation": "sigmoid", "dropout": 0.0},
        "text": {"encoder": "bigru", "bigru_directions": "concat", "word_dim": int(word_dim), "num_layers": 1,
                 "word_vectors": None, **REFERENCE_TOKENS},
    }
    trunk, cfg["features"], image_input, n_cnn = take_image_cnn(state, options, src)
    out.update(trunk)

    out["image_head.global_fc.weight"] = state.pop("img_enc.fc.weight")
    out["image_head.global_fc.bias"] = state.pop("img_enc.fc.bias")
    out.update(_pie(state, "img_enc.pie_net.", "image_head.pie."))
    out.update(_pie(state, "txt_enc.pie_net.", "text_head.pie."))
    state.pop("txt_enc.embed.weight")
    out["text.embed.weight"] = embed_rows
    for key in [k for k in state if k.startswith("txt_enc.rnn.")]:
        out["text.rnn." + key[len("txt_enc.rnn."):]] = state.pop(key)
    if state:
        raise XmrError(f"{src}: unexpected keys {', '.join(sorted(state)[:6])}; is this a PVSE COCO image model?")
    provenance = {"num_embeds": int(k), "legacy": legacy, "image_input": image_input,
                  "dropped_cnn_keys": n_cnn if image_input == "features" else 0}
    if isinstance(obj, dict) and "epoch" in obj:
        provenance["epoch"] = int(obj["epoch"])
    return ImportedModel("pvse", cfg, out, int(image_dim), words, provenance)


CHECKPOINT_FORMATS.register("pvse")(CheckpointFormat(
    name="pvse", read=read_pvse, needs_vocab=True,
    description="yalesong/pvse COCO image models (ResNet-152 + GloVe BiGRU, K = 1 or 2); options: "
                + ", ".join(OPTIONS),
    published_at="https://github.com/yalesong/pvse#pretrained-models (Google Drive: coco_pvse_k1.pth, "
                 "coco_pvse.pth; vocabulary: vocab/coco_vocab.pkl from the repository's prepare script)"))
