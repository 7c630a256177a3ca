"""``--format pcme``: naver-ai/pcme's released COCO models (``pcme_coco.pth``, ``pcme_cutmix_coco.pth``).

Container (``engine/base.py`` ``save_models``): ``{'model', 'criterion' (shift, negative_scale), 'optimizer',
'lr_scheduler', 'config', 'word2idx', 'metadata'}``; a bare model state dict is read too (then ``--vocab``, the
reference's ``datasets/vocabs/coco_vocab.pkl``, gives the words, and the criterion's a, b stay at the released
config's initial 15, 15). Tensors saved under apex O2 are float16: they become float32.

Reference -> xmr (``xmr.methods.pcme``): ``img_enc.fc`` -> ``image_fc``; ``img_enc.pie_net`` -> ``image_pie``;
``img_enc.uncertain_net.{attention, fc}`` -> ``image_sigma``, its ``fc2`` -> ``image_sigma_global``;
``txt_enc.rnn`` (BiGRU, D/2 per direction, concatenated, read at len - 1) -> ``text.rnn``
(``text.bigru_directions: concat``, ``model.text_pool: last``); ``txt_enc.uncertain_net.rnn`` ->
``text_sigma_global.rnn``; criterion ``negative_scale``/``shift`` -> ``scale``/``shift``. The ResNet
(``img_enc.cnn.*``) runs as xmr's end-to-end backbone (``image_input: images``) or is dropped for precomputed
``resnet152_224_torchvision`` grids (``image_input: features``).

Options: ``num_samples`` (J at test time; default the checkpoint's ``n_samples_inference``), ``eval_seed`` (the
seed of the fixed test-time noise), ``score`` (``model.pcme_score``; default log_match_prob, the paper's match
probability ranking; the released config's ``eval_method: matmul`` is ``sample_mean_dot``), ``image_input``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from xmr.checkpoints.base import (CHECKPOINT_FORMATS, CheckpointFormat, ImportedModel, check_state_keys, load_official,
                                  plain_data, strip_prefix)
from xmr.checkpoints.common import (REFERENCE_TOKENS, check_options, float32_state, option, reference_vocab_words,
                                    take_image_cnn, to_xmr_vocab, words_by_index)
from xmr.core.errors import XmrError
from xmr.methods.pcme import LOG_SCORE_RERANKERS, SCORE_MEASURES

OPTIONS = ("num_samples", "eval_seed", "score", "image_input")
ATTENTION = {"attention.w_1.": "attention.w1.", "attention.w_2.": "attention.w2."}
# reference prefix -> xmr prefix (longest first); pie_net/uncertain_net attention names translated by ATTENTION
KEY_MAP = [
    ("img_enc.uncertain_net.fc2.", "image_sigma_global."),
    ("img_enc.uncertain_net.", "image_sigma."),
    ("img_enc.pie_net.", "image_pie."),
    ("img_enc.fc.", "image_fc."),
    ("txt_enc.uncertain_net.rnn.", "text_sigma_global.rnn."),
    ("txt_enc.uncertain_net.", "text_sigma."),
    ("txt_enc.pie_net.", "text_pie."),
    ("txt_enc.rnn.", "text.rnn."),
]
# xmr's PCME keys after the mapping, besides the CNN: the set a released COCO model must give
EXPECTED_HEAD = {
    "image_fc.weight", "image_fc.bias", "image_sigma_global.weight", "image_sigma_global.bias",
    "image_sigma.fc.weight", "image_sigma.fc.bias", "image_sigma.attention.w1.weight",
    "image_sigma.attention.w2.weight", "text_sigma.fc.weight", "text_sigma.fc.bias",
    "text_sigma.attention.w1.weight", "text_sigma.attention.w2.weight",
    *(f"{p}.{n}" for p in ("image_pie", "text_pie") for n in (
        "attention.w1.weight", "attention.w2.weight", "fc.weight", "fc.bias", "layer_norm.weight",
        "layer_norm.bias")),
    *(f"{p}.{n}{d}" for p in ("text.rnn", "text_sigma_global.rnn")
      for n in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0") for d in ("", "_reverse")),
}


def _map_key(key: str) -> str | None:
    for ref, new in KEY_MAP:
        if key.startswith(ref):
            rest = key[len(ref):]
            for a, b in ATTENTION.items():
                if rest.startswith(a):
                    rest = b + rest[len(a):]
            return new + rest
    return None


def _criterion(obj: dict, src: Path) -> tuple[float, float]:
    crit = obj.get("criterion")
    if not isinstance(crit, dict) or "shift" not in crit or "negative_scale" not in crit:
        raise XmrError(f"{src}: 'criterion' lacks shift/negative_scale; is this a PCME checkpoint?")
    return float(crit["negative_scale"].reshape(-1)[0]), float(crit["shift"].reshape(-1)[0])


def read_pcme(src: Path, vocab: Path | None, options: dict) -> ImportedModel:
    check_options(options, OPTIONS, "pcme")
    obj = load_official(src)  # numpy-1 scalars of metadata: the shared allow-list
    container = isinstance(obj, dict) and isinstance(obj.get("model"), dict)
    state = obj["model"] if container else obj
    if not isinstance(state, dict) or not state:
        raise XmrError(f"{src}: not a PCME checkpoint (expected {{'model', 'criterion', 'config', ...}} or a state "
                       f"dict)")
    state = float32_state(strip_prefix(state, "module."), src)
    if "img_enc.pie_net.fc.weight" in state and not any(k.startswith("img_enc.uncertain_net.") for k in state):
        raise XmrError(f"{src}: a PVSE checkpoint (PIE heads, no uncertainty heads), not PCME; import it with "
                       f"--format pvse --vocab vocab/coco_vocab.pkl")
    if "img_enc.uncertain_net.fc2.weight" not in state or "txt_enc.embed.weight" not in state:
        raise XmrError(f"{src}: no img_enc.uncertain_net.*/txt_enc.embed.* keys; is this a PCME checkpoint "
                       f"(--format pcme)? found e.g. {', '.join(sorted(state)[:3])}")
    ref_cfg = obj.get("config", {}) if container else {}
    model_cfg = ref_cfg.get("model", {}) if isinstance(ref_cfg, dict) else {}
    scale, shift = _criterion(obj, src) if container else (15.0, 15.0)

    if container and isinstance(obj.get("word2idx"), dict):
        ref_words = words_by_index(obj["word2idx"], src)
        if vocab is not None and reference_vocab_words(vocab) != ref_words:
            raise XmrError(f"{vocab}: this vocabulary differs from the word2idx stored in {src}; drop --vocab")
    elif vocab is not None:
        ref_words = reference_vocab_words(vocab)
    else:
        raise XmrError(f"{src}: a bare state dict has no word2idx; pass --vocab (datasets/vocabs/coco_vocab.pkl)")
    words, embed_rows = to_xmr_vocab(ref_words, state.pop("txt_enc.embed.weight"), vocab or src,
                                     "txt_enc.embed.weight")

    score = option(options, "score", str, "log_match_prob")
    if score not in SCORE_MEASURES:
        raise XmrError(f"--option score={score}: choose one of {', '.join(SCORE_MEASURES)}")
    num_samples = option(options, "num_samples", int, int(model_cfg.get("n_samples_inference") or 7))
    if num_samples < 1:
        raise XmrError(f"--option num_samples={num_samples}: must be >= 1")

    trunk, features, image_input, _ = take_image_cnn(state, options, src)
    out: dict[str, torch.Tensor] = dict(trunk)
    cfg: dict = {"features": features}
    unexpected = []
    for key, value in state.items():
        new = _map_key(key)
        if new not in EXPECTED_HEAD:  # named as in the file
            unexpected.append(key)
        else:
            out[new] = value
    check_state_keys(EXPECTED_HEAD, {k for k in out if not k.startswith("image_backbone.")} | set(unexpected), src,
                     "is this a PCME COCO model (img_probemb and txt_probemb on)?")
    out["text.embed.weight"] = embed_rows
    out["scale"], out["shift"] = torch.tensor(scale), torch.tensor(shift)

    embed_dim, image_dim = out["image_fc.weight"].shape
    word_dim = embed_rows.shape[1]
    for flag, dim, got in (("embed_dim", embed_dim, model_cfg.get("embed_dim")),
                           ("word_dim", word_dim, model_cfg.get("word_dim"))):
        if got is not None and int(got) != dim:
            raise XmrError(f"{src}: config.model.{flag} = {got} but the weights are {dim}-d; the file is inconsistent")
    cfg["model"] = {"embed_dim": int(embed_dim), "num_samples_eval": num_samples,
                    "eval_seed": option(options, "eval_seed", int, 0), "pcme_score": score,
                    "init_scale": scale, "init_shift": shift, "match_sigmoid": "released", "pie_dropout": 0.0,
                    "attention_hidden": None, "text_pool": "last", "text_attention_input": "words",
                    "text_sigma_branch": "gru"}
    cfg["text"] = {"encoder": "bigru", "bigru_directions": "concat", "word_dim": int(word_dim), "num_layers": 1,
                   "word_vectors": None, **REFERENCE_TOKENS}
    cfg["eval"] = {"similarity": SCORE_MEASURES[score]}
    if score != "log_match_prob":  # the re-rankers that read log-probabilities then read similarities
        cfg["eval"]["rerank"] = {name: {"scores": "similarity"} for name in LOG_SCORE_RERANKERS}
    provenance = {"negative_scale": scale, "shift": shift, "image_input": image_input,
                  "eval_method": model_cfg.get("eval_method"), "n_samples_inference": model_cfg.get(
                      "n_samples_inference"), "cnn_type": model_cfg.get("cnn_type"), "container": container}
    meta = obj.get("metadata") if container else None
    if isinstance(meta, dict):
        provenance["metadata"] = plain_data(meta)  # numpy-1 scalars already plain numbers (load_official)
    return ImportedModel("pcme", cfg, out, int(image_dim), words, provenance)


CHECKPOINT_FORMATS.register("pcme")(CheckpointFormat(
    name="pcme", read=read_pcme, needs_vocab=False,
    description="naver-ai/pcme COCO models (ResNet-152 + GloVe BiGRU, probabilistic embeddings); options: "
                + ", ".join(OPTIONS),
    published_at="https://github.com/naver-ai/pcme#pretrained-models (pcme_coco.pth, pcme_cutmix_coco.pth)"))
