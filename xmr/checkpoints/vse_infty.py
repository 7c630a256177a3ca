"""VSE∞ (woodfrog/vse_infty, MIT): ``{'model': [img_enc_state, txt_enc_state], 'opt': Namespace, 'epoch',
'best_rsum', 'Eiters'}``, onto xmr's ``vse_inf`` method.

Supported here: BUTD region features (``precomp_enc_type basic``: FC + residual MLP -> GPO) with the BiGRU text
encoder (branch ``bigru``). The architecture is read from the container (``opt`` and tensor shapes); a
``module.`` prefix (DataParallel) is resolved per encoder. Name map (reference -> xmr):

- image: ``fc`` -> ``image_proj.fc``, ``mlp.layers.i`` -> ``image_proj.mlp.layers.i``, ``mlp.bns.0`` ->
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
from pathlib import Path
from typing import Callable

import torch

from xmr.checkpoints.base import (CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel, load_official, map_encoders,
                                  plain_data, strip_prefix)
from xmr.errors import XmrError

PUBLISHED_AT = ("https://huggingface.co/cccjc/vse-infty (linked from woodfrog/vse_infty's README): folders "
                "{coco,f30k}_butd_region_{bigru,bert}/model_best.pth; BiGRU vocabularies: SCAN's "
                "{coco,f30k}_precomp_vocab.json; BERT: a local bert-base-uncased folder")
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
    from xmr.io import read_json

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


def read_vse_infty(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    if options:
        raise XmrError(f"{src}: format vse_infty takes no options (got {', '.join(options)}); the architecture is "
                       f"read from the checkpoint")
    img, txt, opt, extra = read_container(src)
    prefixed = {"image": any(k.startswith("module.") for k in img), "text": any(k.startswith("module.") for k in txt)}
    img, txt = strip_prefix(img, "module."), strip_prefix(txt, "module.")
    if any(k.startswith("backbone.") for k in img):
        raise XmrError(f"{src}: a VSE∞ grid model (backbone weights inside); xmr imports the BUTD region models of "
                       f"vse_infty so far (docs/checkpoints.md)")
    if any(k.startswith("bert.") for k in txt):
        return read_region_bert(src, vocab, img, txt, opt, extra, prefixed)
    if "fc.weight" not in img or "embed.weight" not in txt:
        raise XmrError(f"{src}: no fc.weight / embed.weight in the encoders' states: not a VSE∞ BUTD region + "
                       f"BiGRU checkpoint; check --format")
    hint = "is this a VSE∞ BUTD region + BiGRU checkpoint (woodfrog/vse_infty, branch bigru)?"
    layers = sum(1 for k in txt if k.startswith("rnn.weight_ih_l") and "reverse" not in k)
    state = map_encoders(img, txt, (REGION_KEYS, bigru_keys(layers)), (REGION_RULES, BIGRU_RULES), src, hint,
                         unused=("mlp.bns.1.",))
    words, state["text.embed.weight"] = vocabulary_rows(
        vocab, src, read_scan_vocab, txt["embed.weight"],
        "coco_precomp_vocab.json (COCO) or f30k_precomp_vocab.json (Flickr30K) from the released vocab folder")
    embed_dim, image_dim = (int(n) for n in img["fc.weight"].shape)
    if gpo_config(img, "gpool.") != gpo_config(txt, "gpool."):
        raise XmrError(f"{src}: the image and text GPO modules differ in size; not a released VSE∞ model")
    config = {
        "method": "vse_inf",
        "model": {"embed_dim": embed_dim, "residual_mlp": True, "gpo": gpo_config(img, "gpool."),
                  "l2_norm": "plus_eps"},
        "text": {"encoder": "bigru", "word_dim": int(txt["embed.weight"].shape[1]), "word_vectors": None,
                 "num_layers": layers,
                 "tokenizer": "nltk", "max_len": 512},
    }
    if "margin" in opt:
        config["loss"] = {"margin": float(opt["margin"])}
    provenance = {**extra, "architecture": "BUTD region (FC + MLP) + BiGRU, GPO pooling",
                  "module_prefix": prefixed, "dropped_unused_keys": sorted(k for k in img if k.startswith("mlp.bns.1.")),
                  "opt": plain_data(opt)}
    return ImportedModel("vse_inf", config, state, image_dim, words, provenance)


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


def read_region_bert(src: Path, vocab: Path | None, img: dict, txt: dict, opt: dict, extra: dict,
                     prefixed: dict) -> ImportedModel:
    """BUTD region + BERT (branch master): BertModel -> ``linear`` on every token -> GPO; ``bert.*`` ->
    ``text.bert.*`` (the tensors of the checkpoint replace the folder's pretrained ones), ``linear`` ->
    ``text.proj``."""
    folder = check_bert_folder(vocab, src)
    hint = "is this a VSE∞ BUTD region + BERT checkpoint (woodfrog/vse_infty, branch master)?"
    # a buffer older transformers versions saved with the weights; the model rebuilds it
    dropped = sorted(k for k in img if k.startswith("mlp.bns.1.")) + [k for k in txt if k == POSITION_IDS]
    txt = {k: v for k, v in txt.items() if k != POSITION_IDS}
    bert_keys = [k for k in txt if k.startswith("bert.")]  # checked one by one by the importer's strict load
    state = map_encoders(img, txt, (REGION_KEYS, bert_keys + ["linear.weight", "linear.bias"] + GPO_KEYS),
                         (REGION_RULES, BERT_RULES), src, hint, unused=("mlp.bns.1.",))
    embed_dim, image_dim = (int(n) for n in img["fc.weight"].shape)
    config = {
        "method": "vse_inf",
        "model": {"embed_dim": embed_dim, "residual_mlp": True, "gpo": gpo_config(img, "gpool."),
                  "l2_norm": "plus_eps"},
        "text": {"encoder": "bert", "bert_path": str(folder), "max_len": 512},
    }
    if "margin" in opt:
        config["loss"] = {"margin": float(opt["margin"])}
    provenance = {**extra, "architecture": "BUTD region (FC + MLP) + BERT, GPO pooling", "module_prefix": prefixed,
                  "dropped_unused_keys": dropped, "opt": plain_data(opt)}
    return ImportedModel("vse_inf", config, state, image_dim, None, provenance)


CHECKPOINT_FORMATS.register("vse_infty")(CheckpointFormat(
    name="vse_infty", read=read_vse_infty, needs_vocab=True, published_at=PUBLISHED_AT, default_backbone="butd_r101_k36",
    description="VSE∞ (woodfrog/vse_infty) model_best.pth: BUTD region features + BiGRU or BERT"))
