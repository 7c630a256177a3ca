"""VSE∞ (woodfrog/vse_infty, MIT): ``{'model': [img_enc_state, txt_enc_state], 'opt': Namespace, 'epoch',
'best_rsum', 'Eiters'}``, onto xmr's ``vse_inf`` method.

Supported here: every released model. Image side, as the file says: BUTD region features (``precomp_enc_type
basic``: FC + residual MLP -> GPO), or a grid model (``backbone``: the CNN's weights inside, ``img_enc.backbone.*``;
C5 grid -> FC -> GPO, run end to end from image files; :func:`grid_image`). Text side: BiGRU (branch ``bigru``) or
BERT (branch ``master``). The architecture is read from the container (``opt`` and tensor shapes); a ``module.``
prefix (DataParallel) is resolved per encoder. Name map (reference -> xmr):

- grid image: ``backbone.resnet.{conv1,bn1,layer1..4}`` -> ``image_backbone.net.trunk.{0,1,4..7}`` (the aliases
  ``backbone.base.N``/``backbone.top.0`` must hold the same tensors; ``backbone.resnet.fc``, the ImageNet classifier,
  is never used: dropped), ``image_encoder.fc``/``image_encoder.gpool`` as the region model's ``fc``/``gpool``;
- region image: ``fc`` -> ``image_proj.fc``, ``mlp.layers.i`` -> ``image_proj.mlp.layers.i``, ``mlp.bns.0`` ->
  ``image_proj.mlp.norms.0`` (``mlp.bns.1`` is built by the reference but never used in its forward: dropped),
  ``gpool.gru`` -> ``image_pool.gru``, ``gpool.linear`` -> ``image_pool.score``;
- text: ``embed`` -> ``text.embed`` (rows permuted: SCAN's vocabulary is ``<pad> <start> <end> <unk>``, xmr's
  ``<pad> <unk> <start> <end>``; ``<mask>`` is appended as the reference's train.py does), ``rnn`` ->
  ``text.rnn``, ``gpool`` -> ``text_pool``.

The imported config uses the reference's l2 normalisation (``model.l2_norm: plus_eps``) and tokens
(``text.tokenizer: nltk``), and never truncates captions.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from xmr.checkpoints.base import (CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel, load_official, map_encoders,
                                  plain_data, strip_prefix)
from xmr.features.backbones import TRUNK_INDEX
from xmr.core.errors import XmrError

PUBLISHED_AT = ("https://huggingface.co/cccjc/vse-infty (linked from woodfrog/vse_infty's README): folders "
                "{coco,f30k}_butd_{region,grid}_{bigru,bert}/model_best.pth and {coco,f30k}_wsl_grid_bert/"
                "model_best.pth; BiGRU vocabularies: SCAN's {coco,f30k}_precomp_vocab.json; BERT: a local "
                "bert-base-uncased folder")
GPO_RULES = [("gpool.gru.", "gru."), ("gpool.linear.", "score.")]
REGION_RULES = [("fc.", "image_proj.fc."), ("mlp.layers.", "image_proj.mlp.layers."),
                ("mlp.bns.0.", "image_proj.mlp.norms.0.")] + [(r, "image_pool." + x) for r, x in GPO_RULES]
BIGRU_RULES = [("embed.", "text.embed."), ("rnn.", "text.rnn.")] + [(r, "text_pool." + x) for r, x in GPO_RULES]
#: released vocabularies of the BiGRU models: SCAN's json (<pad> <start> <end> <unk> first), <mask> appended
SCAN_SPECIALS = ["<pad>", "<start>", "<end>", "<unk>"]


def read_container(src: Path) -> tuple[dict, dict, dict, dict]:
    """(image state, text state, opt as a dict, the container's other plain entries) of a VSE++/VSE∞ file."""
    ck = load_official(src, [argparse.Namespace])
    model = ck.get("model") if isinstance(ck, dict) else None
    if not (isinstance(model, (list, tuple)) and len(model) == 2 and all(isinstance(m, dict) for m in model)):
        raise XmrError(f"{src}: not a VSE++/VSE∞ checkpoint (expected a dict with 'model': [image state, text "
                       f"state] and 'opt'); check the file and --format")
    opt = ck.get("opt")
    opt = vars(opt) if isinstance(opt, argparse.Namespace) else (opt if isinstance(opt, dict) else {})
    extra = {k: plain_data(ck[k]) for k in ("epoch", "best_rsum", "Eiters") if k in ck}
    return dict(model[0]), dict(model[1]), opt, extra


def read_scan_vocab(path: Path, src: Path, rows: int, append_mask: bool = True) -> list[str]:
    """Words of a SCAN vocabulary json in index order (+ ``<mask>``), checked against the embedding's rows."""
    from xmr.core.io import read_json

    if path.is_file() and path.read_bytes()[:1] == b"\x80":  # pickle protocol >= 2 (VSE++/PVSE's vocab/*.pkl)
        raise XmrError(f"{path}: a pickled vocabulary, but --format vse_infty reads SCAN's vocabulary json; pass "
                       f"coco_precomp_vocab.json (COCO) or f30k_precomp_vocab.json (Flickr30K)")
    doc = read_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("word2idx"), dict):
        raise XmrError(f"{path}: not a SCAN vocabulary json (no 'word2idx'); pass the {{coco,f30k}}_precomp_vocab.json "
                       f"of the released vocab folder")
    words = [w for w, _ in sorted(doc["word2idx"].items(), key=lambda kv: int(kv[1]))]
    if [doc["word2idx"][w] for w in words] != list(range(len(words))):
        raise XmrError(f"{path}: word2idx is not a 0..n-1 numbering; is this the released vocabulary file?")
    if append_mask and "<mask>" not in doc["word2idx"]:
        words.append("<mask>")
    if len(words) != rows:
        raise XmrError(f"{path}: {len(words)} words (with <mask>) but {src} has a {rows}-row word embedding; pass "
                       f"the vocabulary the model was trained with (coco_precomp_vocab.json for COCO models, "
                       f"f30k_precomp_vocab.json for Flickr30K)")
    missing = [w for w in SCAN_SPECIALS if w not in doc["word2idx"]]
    if missing:
        raise XmrError(f"{path}: no {', '.join(missing)} entries; not a SCAN vocabulary")
    return words


def xmr_word_order(ref_words: list[str], embed: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """xmr's vocabulary (its specials first) and the embedding rows permuted to it."""
    from xmr.text.vocab import SPECIALS

    words = SPECIALS + [w for w in ref_words if w not in SPECIALS]
    index = {w: i for i, w in enumerate(ref_words)}
    return words, embed[torch.tensor([index[w] for w in words])].clone()


def vocabulary_rows(vocab: Path | None, src: Path, read: Callable[[Path, Path, int], list[str]],
                    embed: torch.Tensor, missing: str) -> tuple[list[str], torch.Tensor]:
    """(xmr's vocabulary, the embedding rows permuted to it) from a reference vocabulary file; ``read(vocab, src,
    rows)`` lists its words in index order (checking the count); ``missing``: what to pass when none is given."""
    if vocab is None:
        raise XmrError(f"{src}: a BiGRU model needs its vocabulary: pass --vocab {missing}")
    return xmr_word_order(read(Path(vocab), src, int(embed.shape[0])), embed)


def gru_keys(prefix: str, layers: int, bidirectional: bool = True) -> list[str]:
    names = [f"{w}_l{k}{d}" for k in range(layers) for d in ("", "_reverse")[: 1 + bidirectional]
             for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    return [prefix + n for n in names]


def bn_keys(prefix: str) -> list[str]:
    return [prefix + n for n in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]


#: the reference's state-dict keys of EncoderImageAggr (region) and EncoderText (BiGRU, ``layers`` GRU layers)
GPO_KEYS = gru_keys("gpool.gru.", 1) + ["gpool.linear.weight"]
REGION_KEYS = (["fc.weight", "fc.bias"] + [f"mlp.layers.{i}.{w}" for i in (0, 1) for w in ("weight", "bias")]
               + bn_keys("mlp.bns.0.") + bn_keys("mlp.bns.1.") + GPO_KEYS)


def bigru_keys(layers: int) -> list[str]:
    return ["embed.weight"] + gru_keys("rnn.", layers) + GPO_KEYS


def gpo_config(state: dict, prefix: str) -> dict:
    w = state[prefix + "gru.weight_ih_l0"]
    return {"pe_dim": int(w.shape[1]), "hidden_dim": int(w.shape[0] // 3)}


@dataclass
class ImageSide:
    """What the image encoder of a VSE∞ file gives the import: the reference keys it must hold (backbone aside), their
    renaming, keys dropped as unused, the mapped backbone tensors, and the config sections it fixes."""

    expected: list[str]
    rules: list[tuple[str, str]]
    unused: tuple[str, ...]
    backbone_state: dict[str, torch.Tensor]
    config: dict
    image_dim: int
    architecture: str
    dropped: list[str]
    head_prefix: str = ""  # of fc./gpool. in the image encoder's state


def region_image(img: dict, src: Path) -> ImageSide:
    """BUTD region features (``precomp_enc_type basic``): FC + residual MLP -> GPO."""
    if "fc.weight" not in img:
        raise XmrError(f"{src}: no fc.weight in the image encoder's state: not a VSE∞ checkpoint; check --format")
    return ImageSide(REGION_KEYS, REGION_RULES, ("mlp.bns.1.",), {}, {"model": {"residual_mlp": True}},
                     int(img["fc.weight"].shape[1]), "BUTD region (FC + MLP)",
                     sorted(k for k in img if k.startswith("mlp.bns.1.")))


# -- grid models (precomp_enc_type backbone): the CNN inside the image encoder ---------------------------------
GRID_KEYS = ["image_encoder.fc.weight", "image_encoder.fc.bias"] + ["image_encoder." + k for k in GPO_KEYS]
GRID_RULES = [("image_encoder.fc.", "image_proj.fc.")] + [("image_encoder." + r, "image_pool." + x)
                                                          for r, x in GPO_RULES]
#: ResnetFeatureExtractor keeps the ResNet as ``resnet`` and again as base = Sequential(conv1, bn1, relu, maxpool,
#: layer1..3), top = Sequential(layer4): the same tensors under two names
ALIASES = {"base.0.": "conv1.", "base.1.": "bn1.", "base.4.": "layer1.", "base.5.": "layer2.", "base.6.": "layer3.",
           "top.0.": "layer4."}
#: the released grid models' ``opt.backbone_source`` -> (backbones.yaml key, description)
GRID_BACKBONES = {
    "detector": ("butd_r101_grid_512", "BUTD Caffe ResNet-101 grid"),
    "wsl": ("resnext101_wsl_512_inter_linear", "WSL ResNeXt-101 32x8d grid"),
}
#: RawImageDataset: base_target_size 256, times opt.input_scale_factor (the released grid models: 2.0 -> 512)
BASE_TARGET_SIZE = 256


def is_grid_model(img: dict) -> bool:
    return any(k.startswith("backbone.") for k in img)


def resolved_backbone(img: dict, src: Path) -> dict[str, torch.Tensor]:
    """The backbone's tensors once, under the ResNet's names (``conv1.``, ``layer4.`` ...): ``backbone.resnet.*``,
    each alias ``backbone.base.N.*``/``backbone.top.0.*`` checked to hold the same values."""
    resnet, aliases = {}, {}
    for key, value in img.items():
        if not key.startswith("backbone."):
            continue
        rest = key[len("backbone."):]
        if rest.startswith("resnet."):
            resnet[rest[len("resnet."):]] = value
            continue
        alias = next((a for a in ALIASES if rest.startswith(a)), None)
        if alias is None:
            raise XmrError(f"{src}: unexpected key img_enc.{key}; is this a VSE∞ grid checkpoint "
                           f"(woodfrog/vse_infty)?")
        aliases[ALIASES[alias] + rest[len(alias):]] = (key, value)
    if not resnet:
        raise XmrError(f"{src}: no img_enc.backbone.resnet.* weights; not a VSE∞ grid checkpoint")
    used = {k for k in resnet if not k.startswith("fc.")}  # the ImageNet classifier: never used
    odd = sorted(k for k in used if k.split(".")[0] not in TRUNK_INDEX)
    if odd:
        raise XmrError(f"{src}: unexpected key img_enc.backbone.resnet.{odd[0]}; is this a VSE∞ grid checkpoint "
                       f"(woodfrog/vse_infty)?")
    if aliases and set(aliases) != used:
        odd = sorted(set(aliases) ^ used)
        raise XmrError(f"{src}: the backbone's alias keys (backbone.base.*, backbone.top.*) do not cover the same "
                       f"tensors as backbone.resnet.* (e.g. {odd[0]}); the file is incomplete or not a released "
                       f"VSE∞ grid model")
    for name, (key, value) in aliases.items():
        if value.shape != resnet[name].shape or not torch.equal(value, resnet[name]):
            raise XmrError(f"{src}: img_enc.{key} differs from img_enc.backbone.resnet.{name}, which it aliases in "
                           f"the reference; the file is damaged or edited (re-download it)")
    return {k: resnet[k] for k in sorted(used)}


def grid_backbone_source(resnet: dict, opt: dict, src: Path) -> str:
    """``detector`` or ``wsl``: from ``opt.backbone_source``, checked against the weights' shapes (ResNeXt's grouped
    3x3 convolutions), or from the shapes alone when ``opt`` does not say."""
    conv2 = resnet.get("layer1.0.conv2.weight")
    blocks = {k.split(".")[1] for k in resnet if k.startswith("layer3.")}
    if conv2 is None or len(blocks) != 23:
        raise XmrError(f"{src}: the backbone is not a ResNet-101/ResNeXt-101 (layer3 has {len(blocks)} blocks, not "
                       f"23); xmr imports VSE∞'s released grid models (BUTD ResNet-101, WSL ResNeXt-101 32x8d)")
    shapes = "wsl" if conv2.shape[1] != conv2.shape[0] else "detector"  # grouped 3x3: ResNeXt
    given = str(opt.get("backbone_source") or "")
    source = next((s for s in GRID_BACKBONES if s in given), None)
    if given and source is None:
        raise XmrError(f"{src}: opt.backbone_source is {given!r}; xmr imports the released grid models "
                       f"(detector: BUTD ResNet-101, wsl: ResNeXt-101 32x8d WSL)")
    if source is not None and source != shapes:
        raise XmrError(f"{src}: opt.backbone_source is {given!r} but the backbone's weights are a "
                       f"{GRID_BACKBONES[shapes][1]}; the file is not a released VSE∞ model")
    return source or shapes


def grid_image(img: dict, opt: dict, src: Path) -> ImageSide:
    """A grid model (``precomp_enc_type backbone``): the CNN's C5 grid -> FC (no MLP) -> GPO, end to end from image
    files. The backbone runs as config/backbones.yaml's entry for ``opt.backbone_source`` at the reference's test
    input size, ``256 * opt.input_scale_factor`` squared."""
    resnet = resolved_backbone(img, src)
    source = grid_backbone_source(resnet, opt, src)
    key, description = GRID_BACKBONES[source]
    # the ResNet's modules -> xmr's trunk Sequential (TorchvisionGrid and CaffeResNetGrid share the layout)
    trunk = {}
    for name, value in resnet.items():
        head, _, rest = name.partition(".")
        trunk[f"image_backbone.net.trunk.{TRUNK_INDEX[head]}.{rest}"] = value
    fc = img.get("image_encoder.fc.weight")
    feature_dim = int(resnet["layer4.0.conv3.weight"].shape[0])
    if fc is None or int(fc.shape[1]) != feature_dim:
        raise XmrError(f"{src}: image_encoder.fc.weight {tuple(fc.shape) if fc is not None else 'missing'} does not "
                       f"read the backbone's {feature_dim}-d grid; not a released VSE∞ grid model")
    size = int(BASE_TARGET_SIZE * float(opt.get("input_scale_factor") or 1))
    config = {"features": {"source": "images", "backbone": key}, "image_backbone": {"input_size": size},
              "model": {"residual_mlp": False}}
    dropped = sorted(k for k in img if k.startswith("backbone.resnet.fc."))
    return ImageSide(GRID_KEYS, GRID_RULES, (), trunk, config, feature_dim, f"{description} ({size} px)", dropped,
                     "image_encoder.")


def read_vse_infty(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    """The image side from the file (grid: ``backbone.*`` weights inside, :func:`grid_image`; else BUTD regions),
    the text side too (``bert.*`` weights: BERT, branch master; else BiGRU, branch bigru)."""
    if options:
        raise XmrError(f"{src}: format vse_infty takes no options (got {', '.join(options)}); the architecture is "
                       f"read from the checkpoint")
    img, txt, opt, extra = read_container(src)
    prefixed = {"image": any(k.startswith("module.") for k in img), "text": any(k.startswith("module.") for k in txt)}
    img, txt = strip_prefix(img, "module."), strip_prefix(txt, "module.")
    kind = opt.get("precomp_enc_type")
    if kind in ("basic", "backbone") and (kind == "backbone") != is_grid_model(img):
        raise XmrError(f"{src}: opt.precomp_enc_type is {kind!r} but the file holds "
                       f"{'no' if kind == 'backbone' else 'its'} CNN weights (img_enc.backbone.*); the file is "
                       f"incomplete or edited: re-download it")
    image = grid_image(img, opt, src) if is_grid_model(img) else region_image(img, src)
    head = {k: v for k, v in img.items() if not k.startswith("backbone.")}
    bert = any(k.startswith("bert.") for k in txt)
    dropped = list(image.dropped)
    if bert:
        folder = check_bert_folder(vocab, src)
        # a buffer older transformers versions saved with the weights; the model rebuilds it
        dropped += [k for k in txt if k == POSITION_IDS]
        txt = {k: v for k, v in txt.items() if k != POSITION_IDS}
        # the bert.* keys are checked one by one by the importer's strict load
        text_expected = [k for k in txt if k.startswith("bert.")] + ["linear.weight", "linear.bias"] + GPO_KEYS
        text_rules, text_name, branch = BERT_RULES, "BERT", "master"
    else:
        if "embed.weight" not in txt:
            raise XmrError(f"{src}: no embed.weight (BiGRU) or bert.* (BERT) in the text encoder's state: not a VSE∞ "
                           f"checkpoint; check --format")
        layers = sum(1 for k in txt if k.startswith("rnn.weight_ih_l") and "reverse" not in k)
        text_expected, text_rules, text_name, branch = bigru_keys(layers), BIGRU_RULES, "BiGRU", "bigru"
    architecture = f"{image.architecture} + {text_name}, GPO pooling"
    hint = f"is this a VSE∞ {image.architecture.split(' (')[0]} + {text_name} checkpoint (woodfrog/vse_infty, " \
           f"branch {branch})?"
    state = map_encoders(head, txt, (image.expected, text_expected), (image.rules, text_rules), src, hint,
                         unused=image.unused)
    state.update(image.backbone_state)
    words = None
    if bert:
        text_config = {"encoder": "bert", "bert_path": str(folder), "max_len": 512}
    else:
        words, state["text.embed.weight"] = vocabulary_rows(
            vocab, src, read_scan_vocab, txt["embed.weight"],
            "coco_precomp_vocab.json (COCO) or f30k_precomp_vocab.json (Flickr30K) from the released vocab folder")
        text_config = {"encoder": "bigru", "word_dim": int(txt["embed.weight"].shape[1]), "word_vectors": None,
                       "num_layers": layers, "tokenizer": "nltk", "max_len": 512}
    gpo = gpo_config(head, image.head_prefix + "gpool.")
    if gpo != gpo_config(txt, "gpool."):
        raise XmrError(f"{src}: the image and text GPO modules differ in size; not a released VSE∞ model")
    config = {
        **image.config,
        "method": "vse_inf",
        "model": {**image.config["model"], "embed_dim": int(head[image.head_prefix + "fc.weight"].shape[0]),
                  "gpo": gpo, "l2_norm": "plus_eps"},
        "text": text_config,
    }
    if "margin" in opt:
        config["loss"] = {"margin": float(opt["margin"])}
    provenance = {**extra, "architecture": architecture, "module_prefix": prefixed, "dropped_unused_keys": dropped,
                  "opt": plain_data(opt)}
    return ImportedModel("vse_inf", config, state, image.image_dim, words, provenance)


#: tokenizer files of a BERT folder (save_pretrained); one of them must be there
BERT_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")
POSITION_IDS = "bert.embeddings.position_ids"
BERT_RULES = [("bert.", "text.bert."), ("linear.", "text.proj.")] + [(r, "text_pool." + x) for r, x in GPO_RULES]


def check_bert_folder(vocab: Path | None, src: Path) -> Path:
    """The local BERT folder a BERT model's text side is built from (its tokenizer files and config)."""
    what = ("the local bert-base-uncased folder the model was trained with (`huggingface-cli download "
            "bert-base-uncased --local-dir DIR` on a connected machine)")
    if vocab is None or not Path(vocab).is_dir():
        raise XmrError(f"{src}: a VSE∞ BERT model needs its tokenizer: pass --vocab DIR, {what}")
    vocab = Path(vocab)
    if not any((vocab / f).is_file() for f in BERT_TOKENIZER_FILES):
        raise XmrError(f"{vocab}: no tokenizer files ({' or '.join(BERT_TOKENIZER_FILES)}) for the BERT model "
                       f"{src}; pass {what}")
    if not (vocab / "config.json").is_file():
        raise XmrError(f"{vocab}: no config.json for the BERT model {src}; pass {what}")
    return vocab


CHECKPOINT_FORMATS.register("vse_infty")(CheckpointFormat(
    name="vse_infty", read=read_vse_infty, needs_vocab=True, published_at=PUBLISHED_AT, default_backbone="butd_r101_k36",
    description="VSE∞ (woodfrog/vse_infty) model_best.pth: BUTD region features or a grid model's own CNN (BUTD "
                "ResNet-101, WSL ResNeXt-101), + BiGRU or BERT"))
