"""VSE++ (fartashf/vsepp, Apache-2.0): ``{'model': [img_enc_state, txt_enc_state], 'opt': Namespace, 'epoch',
'best_rsum', 'Eiters'}`` (Python 2 / torch 0.3 pickles, pre-zip format), onto xmr's ``vsepp`` method.

Supported here: the models on precomputed features (``--data_name *_precomp``: ``EncoderImagePrecomp``, one ``fc``
on one feature vector per image). The text side is a one-directional GRU over learned word embeddings, read at
the last real token (``text.bigru_directions: forward``, ``model.text_pool: last``), with ``<start> ... <end>`` around
nltk's tokens (``text.tokenizer: nltk``). The vocabulary is the released pickled ``Vocabulary``
(``{data_name}_vocab.pkl``), read without running pickle code; its ``<pad> <start> <end> <unk>`` order becomes
xmr's ``<pad> <unk> <start> <end>`` (embedding rows permuted). Name map: ``fc`` -> ``image_proj.fc``, ``embed``
-> ``text.embed``, ``rnn`` -> ``text.rnn``.
"""

from __future__ import annotations

from pathlib import Path

from xmr.checkpoints.base import (CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel, load_plain_pickle,
                                  map_encoders, plain_data)
from xmr.checkpoints.vse_infty import gru_keys, read_container, vocabulary_rows
from xmr.core.errors import XmrError

PUBLISHED_AT = ("https://github.com/fartashf/vsepp (README 'Pre-trained models': runs.tar with "
                "runs/{coco,f30k}_vse++*/model_best.pth.tar; vocab.tar with vocab/{data_name}_vocab.pkl)")
#: the pickled Vocabulary as vocab.py wrote it (run as a script: __main__) or imported (vocab)
VOCAB_CLASSES = [("vocab", "Vocabulary"), ("__main__", "Vocabulary")]


def read_pickled_vocab(path: Path, src: Path, rows: int) -> list[str]:
    """Words of a released ``Vocabulary`` pickle in index order, checked against the embedding's rows."""
    obj = load_plain_pickle(path, VOCAB_CLASSES)
    word2idx = getattr(obj, "word2idx", None)
    if not isinstance(word2idx, dict):
        raise XmrError(f"{path}: no word2idx in this pickle; pass the released {{data_name}}_vocab.pkl")
    words = [w for w, _ in sorted(word2idx.items(), key=lambda kv: int(kv[1]))]
    if [word2idx[w] for w in words] != list(range(len(words))):
        raise XmrError(f"{path}: word2idx is not a 0..n-1 numbering; is this the released vocabulary file?")
    if len(words) != rows:
        raise XmrError(f"{path}: {len(words)} words but {src} has a {rows}-row word embedding; pass the vocabulary "
                       f"the model was trained with (vocab/{{data_name}}_vocab.pkl of the same dataset)")
    missing = [w for w in ("<pad>", "<start>", "<end>", "<unk>") if w not in word2idx]
    if missing:
        raise XmrError(f"{path}: no {', '.join(missing)} entries; not a VSE++ vocabulary")
    return words


#: (opt.cnn_type, opt.img_dim) of a ``*_precomp`` run -> the config/backbones.yaml entry of those vectors
PRECOMP_BACKBONES = {("vgg19", 4096): "vsepp_vgg19_precomp", ("resnet152", 2048): "vsepp_resnet152_precomp"}


def precomputed_backbone(opt: dict, image_dim: int, src: Path) -> str | None:
    """The precomputed features a ``*_precomp`` model reads, from its ``opt`` (``data_name``, ``cnn_type``,
    ``img_dim``) and the image layer's input size; ``None`` where they do not say (the import then asks for
    ``--set features.backbone=KEY``)."""
    data_name, cnn = str(opt.get("data_name", "")), str(opt.get("cnn_type", "vgg19"))
    if not data_name.endswith("precomp"):
        return None  # full-image files keep train.py's img_dim default (4096) whatever their CNN
    if int(opt.get("img_dim", image_dim)) != image_dim:
        raise XmrError(f"{src}: opt.img_dim = {opt.get('img_dim')} but img_enc.fc takes {image_dim}-d features; "
                       f"the file is inconsistent")
    return PRECOMP_BACKBONES.get((cnn, image_dim))


def read_vsepp(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    if options:
        raise XmrError(f"{src}: format vsepp takes no options (got {', '.join(options)}); the architecture is read "
                       f"from the checkpoint")
    img, txt, opt, extra = read_container(src)
    # a full-image model (cnn.* keys): its CNN is read by xmr/checkpoints/vsepp_full.py, the rest as below
    cnn = {k: img.pop(k) for k in [k for k in img if k.startswith("cnn.")]}
    if opt.get("measure", "cosine") != "cosine" or opt.get("use_abs") or opt.get("no_imgnorm"):
        raise XmrError(f"{src}: an order-embedding / no-norm variant (measure={opt.get('measure')}, use_abs="
                       f"{opt.get('use_abs')}, no_imgnorm={opt.get('no_imgnorm')}); xmr imports the cosine models")
    layers = sum(1 for k in txt if k.startswith("rnn.weight_ih_l"))
    if any("reverse" in k for k in txt):
        raise XmrError(f"{src}: a bidirectional text GRU; not a released VSE++ model (is --format vse_infty right?)")
    hint = "is this a VSE++ precomputed-feature checkpoint (fartashf/vsepp)?"
    expected = (["fc.weight", "fc.bias"], ["embed.weight"] + gru_keys("rnn.", layers, bidirectional=False))
    rules = ([("fc.", "image_proj.fc.")], [("embed.", "text.embed."), ("rnn.", "text.rnn.")])
    state = map_encoders(img, txt, expected, rules, src, hint)
    words, state["text.embed.weight"] = vocabulary_rows(
        vocab, src, read_pickled_vocab, txt["embed.weight"],
        f"vocab/{opt.get('data_name', 'coco_precomp')}_vocab.pkl from the released vocab.tar")
    embed_dim, image_dim = (int(n) for n in img["fc.weight"].shape)
    config = {
        "method": "vsepp",
        "model": {"embed_dim": embed_dim, "residual_mlp": False, "image_pool": "mean", "text_pool": "last"},
        "text": {"encoder": "bigru", "bigru_directions": "forward", "word_dim": int(txt["embed.weight"].shape[1]),
                 "word_vectors": None, "num_layers": layers, "tokenizer": "nltk", "max_len": 512},
        "loss": {"margin": float(opt.get("margin", 0.2)), "max_violation": bool(opt.get("max_violation", True))},
    }
    backbone = precomputed_backbone(opt, image_dim, src)
    if backbone:
        config["features"] = {"source": "precomputed", "backbone": backbone}
    provenance = {**extra, "architecture": "precomputed features (fc) + one-directional GRU read at the last token",
                  "opt": plain_data(opt)}
    if cnn:
        from xmr.checkpoints.vsepp_full import read_full_image
        from xmr.config.loader import deep_merge

        cnn_state, sections, full = read_full_image(cnn, opt, src)
        state.update(cnn_state)
        config = deep_merge(config, sections)
        provenance.update(full, architecture="its CNN end to end, avgpool/fc7 -> l2norm -> fc + one-directional "
                                             "GRU read at the last token")
    return ImportedModel("vsepp", config, state, image_dim, words, provenance)


CHECKPOINT_FORMATS.register("vsepp")(CheckpointFormat(
    name="vsepp", read=read_vsepp, needs_vocab=True, published_at=PUBLISHED_AT,
    description="VSE++ (fartashf/vsepp) model_best.pth.tar on precomputed features"))
