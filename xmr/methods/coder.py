"""CODER (Wang et al., ECCV 2022): coupled diversity-sensitive momentum contrastive learning.

Reconstructed from the supplement (the main paper and code are not available; see docs/methods/coder.md):

- instance branch: projected regions (FC + residual MLP) and text tokens, each pooled by GPO -> v^I, w^I;
- concept branch: a concept vocabulary (the most frequent content words of the training captions), a binarised
  co-occurrence graph, a graph convolution over GloVe-initialised concept vectors -> concept embeddings Y; a
  query per modality (the visual one is the instance GPO output: weights shared) attends over Y with a bilinear
  softmax -> v^C, w^C;
- momentum (EMA) copies of the instance encoders fill an image queue and a text queue;
- losses: in-batch DCL on the instance embeddings, DCL against the momentum keys + queues, in-batch DCL on the
  concept embeddings and a pseudo-label loss (concept embeddings predict Sinkhorn cluster codes of the momentum
  instance keys).

Embeddings are (B, 2, D) sets [instance, concept]; the evaluation score is
``fusion_alpha · S^I + (1 - fusion_alpha) · S^C`` (``eval.similarity: model``).

Every addition to the GPO base switches off: ``model.concept.enabled: false`` (no concept branch, no pseudo
labels: embeddings (B, 1, D)), ``loss.weight_memory: 0`` (no memory-bank term; without it and the pseudo labels
no momentum encoders or queues are built) and ``loss.ranking: triplet`` (VSE∞'s hinge with its summed-hinge
warm-up instead of DCL). With all three CODER is VSE∞, weight for weight (tests/test_reductions.py).

The concept vocabulary and graph are built from the training split the first time the model runs in training
mode (the trainer gives the constructor no captions); they live in the state dict (the words as extra state,
the graph as buffers, the concept vectors as a parameter), so ``load_trained`` rebuilds the model without data.

Each queue entry carries the dataset index of its image (``queue_image``, -1 = empty slot), taken from
the ``image_index`` the trainer gives every training forward, so entries of an anchor's own
image are recognised exactly, whatever crop or augmentation produced them.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xmr.config.loader import method_schema
from xmr.core.errors import XmrError
from xmr.losses.diversity_contrastive import dcl_loss
from xmr.losses.pseudo_label import pseudo_label_loss, sinkhorn_codes
from xmr.losses.triplet import triplet_loss
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch, drop_regions
from xmr.models.gpo import GPO
from xmr.models.image import LocalProjection

# Function words never chosen as concepts (the supplement selects object/motion/property words).
STOP_WORDS = frozenset("""
a an the and or but nor so yet of to in on at by for from with without into onto upon over under about above below
across after against along among around before behind beneath beside besides between beyond during except inside
near off out outside through throughout toward towards underneath until up down within via as than
is are was were be been being am do does did doing has have had having will would shall should can could may might
must it its it's this that these those there here their theirs them they he him his she her hers we us our you
your i me my mine who whom whose which what where when why how some any each every all both either neither no not
another other such one ones own same very too also just only then
""".split())

_WORD = re.compile(r"^[a-z][a-z'-]*$")


# -- concept vocabulary and graph (pure functions of the training captions) ------------------------------------
def caption_words(tokens: list[str]) -> list[str]:
    """Lower-cased alphabetic tokens that are not stop words."""
    out = []
    for t in tokens:
        t = t.lower()
        if _WORD.match(t) and t not in STOP_WORDS:
            out.append(t)
    return out


def select_concepts(token_lists: list[list[str]], n: int, min_count: int = 1,
                    word_types: dict[str, str] | None = None, type_ratio: tuple = (7, 2, 1)) -> list[str]:
    """The ``n`` most frequent content words (ties broken alphabetically, so the result is deterministic).

    With ``word_types``, only typed words are eligible and the n slots are split by ``type_ratio`` over
    (object, motion, property); slots a type cannot fill go to the most frequent remaining typed words.
    """
    counts = Counter(w for toks in token_lists for w in caption_words(toks))
    ranked = [w for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c >= min_count]
    if word_types is None:
        return ranked[:n]
    types = ("object", "motion", "property")
    bad = sorted({v for v in word_types.values() if v not in types})
    if bad:
        raise XmrError(f"model.concept.word_types: unknown types {bad}; use object, motion or property")
    total = sum(type_ratio)
    quotas = [int(round(n * r / total)) for r in type_ratio]
    quotas[0] += n - sum(quotas)
    chosen: list[str] = []
    for t, q in zip(types, quotas):
        chosen += [w for w in ranked if word_types.get(w) == t][:q]
    rest = [w for w in ranked if w in word_types and w not in set(chosen)]
    chosen += rest[: n - len(chosen)]
    return sorted(chosen, key=lambda w: (-counts[w], w))


def cooccurrence(units: list[set[str]], concepts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(B, N): B_ij = number of units (captions or images) containing concepts i and j (i != j), N_i = units
    containing i."""
    index = {w: i for i, w in enumerate(concepts)}
    q = len(concepts)
    counts = np.zeros((q, q), dtype=np.float64)
    for unit in units:
        ids = sorted(index[w] for w in unit if w in index)
        if ids:
            counts[np.ix_(ids, ids)] += 1
    n = counts.diagonal().copy()
    np.fill_diagonal(counts, 0)
    return counts, n


def concept_adjacency(counts: np.ndarray, n: np.ndarray, eps: float, mode: str = "coder_literal",
                      rescale: str = "cvse", t: float = 5.0, p: float = 0.02) -> np.ndarray:
    """Normalised adjacency Ã from co-occurrence counts: P_ij = B_ij / N_i, optional rescale, H = [P >= eps]."""
    prob = counts / np.maximum(n, 1)[:, None]
    if rescale == "cvse":
        prob = t ** (prob - p) - t ** (-p)
    h = (prob >= eps).astype(np.float64)
    np.fill_diagonal(h, 0)
    eye = np.eye(len(n))
    if mode == "coder_literal":
        d = h.sum(1)
        dinv = np.where(d > 0, 1 / np.sqrt(np.maximum(d, 1e-12)), 0.0)
        return dinv[:, None] * h * dinv[None, :] + eye
    if mode == "kipf":
        a = h + eye
        dinv = 1 / np.sqrt(a.sum(1))
        return dinv[:, None] * a * dinv[None, :]
    if mode == "cvse":
        a = h * 0.25 / (h.sum(0, keepdims=True) + 1e-6) + eye
        dinv = a.sum(1) ** -0.5
        return (a @ np.diag(dinv)).T @ np.diag(dinv)
    raise XmrError(f"model.concept.adj_mode: unknown mode {mode!r}")


# -- the method ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CODERModel:
    """The ``model`` section (:attr:`CODER.schema`)."""
    embed_dim: int
    residual_mlp: bool
    gpo: dict
    size_augment: dict
    text_augment: float
    share_text_query_aggr: bool
    concept: dict
    momentum: float
    queue_size: int
    n_prototypes: int
    fusion_alpha: float


@dataclass(frozen=True)
class CODERLoss:
    """The ``loss`` section (:attr:`CODER.schema`)."""
    mu: float
    gamma: float
    form: str
    diversity: str
    eps_div: float
    sd_formula: str
    div_direction: str
    entropy_temperature: float
    ranking: str
    margin: float
    warmup_epochs: float
    weight_instance: float
    weight_memory: float
    weight_concept: float
    weight_pseudo_label: float
    queue_mask_same_image: bool
    sinkhorn_epsilon: float
    sinkhorn_iterations: int
    prototype_temperature: float
    pl_cross_modal: bool


@METHODS.register("coder")
class CODER(RetrievalModel):
    model_settings_class, loss_settings_class = CODERModel, CODERLoss
    conformance_overrides = {"model": {"queue_size": 64, "n_prototypes": 16}}
    schema = method_schema("coder")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m, d = self.model_settings, self.embed_dim
        c = m.concept
        # instance branch (VSE∞'s encoders, in VSE∞'s order)
        self.image_proj = LocalProjection(image_dim, d, m.residual_mlp)
        self.image_gpo = GPO(**m.gpo)
        self.text = self.build_text_encoder()
        self.text_gpo = GPO(**m.gpo)
        self.concept_enabled = bool(c["enabled"])
        if not self.concept_enabled and m.fusion_alpha < 1:
            raise XmrError(f"model.fusion_alpha: {m.fusion_alpha} mixes in the concept score, but "
                           f"model.concept.enabled is false; set model.fusion_alpha: 1")
        self.text_query_gpo = None if m.share_text_query_aggr or not self.concept_enabled else GPO(**m.gpo)
        # momentum encoders (no gradients; EMA of the instance branch): read by the memory bank and the pseudo labels
        lc = self.loss_settings
        self.momentum_enabled = lc.weight_memory > 0 or (self.concept_enabled and lc.weight_pseudo_label > 0)
        if self.momentum_enabled:
            self.key_image_proj = copy.deepcopy(self.image_proj)
            self.key_image_gpo = copy.deepcopy(self.image_gpo)
            self.key_text = copy.deepcopy(self.text)
            self.key_text_gpo = copy.deepcopy(self.text_gpo)
            for p in self._key_params():
                p.requires_grad_(False)
        if self.concept_enabled:
            self._build_concept_branch()
        if self.momentum_enabled:
            # queues of momentum keys, each entry with the dataset index of its image (-1 = empty slot)
            k = m.queue_size
            self.register_buffer("queue_img", torch.zeros(k, d))
            self.register_buffer("queue_txt", torch.zeros(k, d))
            self.register_buffer("queue_image", torch.full((k,), -1, dtype=torch.long))
            self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))

    def _build_concept_branch(self) -> None:
        """Concept vectors and graph (filled by :meth:`build_concepts`), the GCN, the two query maps and the
        pseudo-label prototypes."""
        m, d, c = self.model_settings, self.embed_dim, self.model_settings.concept
        q = c["n_concepts"]
        self.concept_words: list[str] = []
        self.concept_emb = nn.Parameter(torch.zeros(q, c["word_dim"]), requires_grad=c["trainable"])
        self.register_buffer("concept_adj", torch.eye(q))
        self.register_buffer("concept_valid", torch.zeros(q, dtype=torch.bool))
        self.register_buffer("concepts_built", torch.zeros((), dtype=torch.bool))
        dims = [c["word_dim"], d] if c["gcn_layers"] == 1 else [c["word_dim"], d // 2, d]
        self.gcn = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.query_image = nn.Linear(d, d, bias=False)
        self.query_text = nn.Linear(d, d, bias=False)
        for lin in (self.query_image, self.query_text):
            nn.init.eye_(lin.weight)
        # pseudo labels: prototypes (unit rows)
        self.prototypes = nn.Linear(d, m.n_prototypes, bias=False)
        with torch.no_grad():
            self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))

    # -- state ----------------------------------------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"concept_words": list(getattr(self, "concept_words", []))}

    def set_extra_state(self, state: dict) -> None:
        if self.concept_enabled:
            self.concept_words = list(state.get("concept_words", []))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # Checkpoints written before the queue kept image indices hold ``queue_fingerprint`` instead of
        # ``queue_image``. Their queued keys cannot be matched to images, so they are dropped (the queue refills
        # within queue_size / batch_size steps); the weights, momentum encoders and concepts load unchanged, so
        # such runs still evaluate (the queue is unused at test time) and resume.
        old = state_dict.pop(prefix + "queue_fingerprint", None)
        if old is not None and prefix + "queue_image" not in state_dict:
            warnings.warn(f"coder: checkpoint has the old queue_fingerprint buffer; its {old.numel()} queued keys "
                          "are dropped (the queue starts empty and refills during training)", stacklevel=2)
            state_dict[prefix + "queue_image"] = torch.full(old.shape, -1, dtype=torch.long)
            for name in ("queue_img", "queue_txt", "queue_ptr"):
                if prefix + name in state_dict:
                    state_dict[prefix + name] = torch.zeros_like(state_dict[prefix + name])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _key_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.image_proj, self.key_image_proj), (self.image_gpo, self.key_image_gpo),
                (self.text, self.key_text), (self.text_gpo, self.key_text_gpo)]

    def _key_params(self):
        for _, key in self._key_pairs():
            yield from key.parameters()

    # -- concepts ---------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def build_concepts(self, token_lists: list[list[str]], caption_image: np.ndarray | list[int]) -> None:
        """Concept vocabulary, graph and initial vectors from the training captions (deterministic)."""
        from xmr.core.io import read_json
        from xmr.text.word_vectors import embedding_matrix

        c = self.model_settings.concept
        types = None
        if c["selection"] == "typed":
            if not c["word_types"]:
                raise XmrError("model.concept.selection: typed needs model.concept.word_types (a JSON file "
                               "{word: object|motion|property})")
            types = {k.lower(): v for k, v in read_json(c["word_types"]).items()}
        words = select_concepts(token_lists, c["n_concepts"], c["min_count"], types, tuple(c["type_ratio"]))
        if not words:
            raise XmrError("model.concept: no concept words found in the training captions (all stop words?)")
        if c["cooccurrence_unit"] == "caption":
            units = [set(caption_words(t)) for t in token_lists]
        else:
            by_image: dict[int, set[str]] = {}
            for toks, i in zip(token_lists, caption_image):
                by_image.setdefault(int(i), set()).update(caption_words(toks))
            units = list(by_image.values())
        counts, n = cooccurrence(units, words)
        adj = concept_adjacency(counts, n, c["eps_graph"], c["adj_mode"], c["rescale"], c["rescale_t"],
                                c["rescale_p"])
        init, _ = embedding_matrix(words, c["word_vectors"], c["word_dim"], self.seed)
        if init.shape[1] != c["word_dim"]:
            raise XmrError(f"model.concept.word_dim: {c['word_dim']} but {c['word_vectors']} vectors are "
                           f"{init.shape[1]}-d; set model.concept.word_dim: {init.shape[1]}")
        q = len(words)
        self.concept_words = words
        self.concept_adj.zero_()
        self.concept_adj[:q, :q] = torch.from_numpy(adj).to(self.concept_adj)
        self.concept_valid.zero_()
        self.concept_valid[:q] = True
        self.concept_emb.zero_()
        self.concept_emb[:q] = torch.from_numpy(init).to(self.concept_emb)
        self.concepts_built.fill_(True)

    def prepare(self, train_split) -> None:
        """Build the concepts from the training split (:class:`~xmr.data.base.CaptionedSplit`); the trainer calls
        this before the first step, a loaded checkpoint already holds them."""
        if not self.concept_enabled:
            return
        tokens = train_split.tokens or [re.findall(r"[a-z'-]+", cap.lower()) for cap in train_split.captions]
        self.build_concepts(tokens, train_split.caption_image)

    def _ensure_concepts(self) -> None:
        if self.concept_enabled and not bool(self.concepts_built):
            raise XmrError("CODER: the concept vocabulary is not built; call model.prepare(train_split) (the trainer "
                           "does) or load a trained checkpoint")

    def concept_vectors(self) -> torch.Tensor:
        """Y (q, D): graph convolution of the concept vectors, rows L2-normalised."""
        y = self.concept_emb
        for layer in self.gcn:
            y = F.leaky_relu(self.concept_adj @ layer(y), 0.2)
        return F.normalize(y, dim=-1)

    def _concept_embed(self, query: torch.Tensor, proj: nn.Linear, y: torch.Tensor) -> torch.Tensor:
        lam = self.model_settings.concept["smoothness"]
        logits = lam * proj(F.normalize(query, dim=-1)) @ y.t()
        attn = torch.softmax(logits.masked_fill(~self.concept_valid, float("-inf")), dim=-1)
        return F.normalize(attn @ y, dim=-1)

    # -- encoders ---------------------------------------------------------------------------------------------------
    def _image_embed(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        v = self.image_gpo(self.image_proj(feats), num_regions)
        if not self.concept_enabled:
            return F.normalize(v, dim=-1)[:, None, :]
        query = v.detach() if self.model_settings.concept["detach_query"] else v
        return torch.stack([F.normalize(v, dim=-1), self._concept_embed(query, self.query_image,
                                                                          self.concept_vectors())], dim=1)

    def _text_embed(self, batch: dict) -> torch.Tensor:
        h, lengths = self.text(batch)
        w = self.text_gpo(h, lengths)
        if not self.concept_enabled:
            return F.normalize(w, dim=-1)[:, None, :]
        if self.text_query_gpo is None:  # the instance output is the query (shared aggregator)
            query = w.detach() if self.model_settings.concept["detach_query"] else w
        else:
            query = self.text_query_gpo(h, lengths)
        return torch.stack([F.normalize(w, dim=-1), self._concept_embed(query, self.query_text,
                                                                          self.concept_vectors())], dim=1)

    def encode_image(self, feats: torch.Tensor, num_regions: torch.Tensor) -> torch.Tensor:
        """(B, 2, D): [instance v^I, concept v^C] ((B, 1, D) without the concept branch)."""
        if self.training:
            self._ensure_concepts()
            feats, num_regions = drop_regions(feats, num_regions, **self.model_settings.size_augment)
        return self._image_embed(feats, num_regions)

    def encode_text(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, 2, D): [instance w^I, concept w^C] ((B, 1, D) without the concept branch)."""
        if self.training:
            self._ensure_concepts()
            batch = augment_caption_batch(batch, self.text, self.model_settings.text_augment)
        return self._text_embed(batch)

    def forward(self, feats, num_regions, text, image_index=None):
        """In training mode, besides the embeddings: the momentum keys of the same (augmented) inputs
        (``key_img``, ``key_txt``) and the batch's dataset ``image_index``, which the loss and the queue read."""
        if not self.training:
            return {"img": self.encode_image(feats, num_regions), "txt": self.encode_text(text)}
        self._ensure_concepts()
        m = self.model_settings
        image_index = _checked_image_index(image_index, feats.shape[0], feats.device)
        feats, num_regions = drop_regions(feats, num_regions, **m.size_augment)
        text = augment_caption_batch(text, self.text, m.text_augment)
        out = {"img": self._image_embed(feats, num_regions), "txt": self._text_embed(text), "image_index": image_index}
        if self.momentum_enabled:
            with torch.no_grad():  # momentum keys of the same (augmented) inputs
                out["key_img"] = F.normalize(self.key_image_gpo(self.key_image_proj(feats), num_regions).float(),
                                             dim=-1)
                h, lengths = self.key_text(text)
                out["key_txt"] = F.normalize(self.key_text_gpo(h, lengths).float(), dim=-1)
        return out

    # -- training ---------------------------------------------------------------------------------------------------
    def compute_loss(self, out, positives, epoch):
        if "image_index" not in out:
            raise XmrError("coder: compute_loss needs the output of a training-mode forward (model(...)), with "
                           "the batch's image indices and momentum keys")
        c = self.loss_settings
        img, txt = out["img"], out["txt"]
        v_i, w_i = img[:, 0], txt[:, 0]
        b = v_i.shape[0]
        eye = torch.eye(b, dtype=torch.bool, device=img.device)
        neg = ~(positives | eye)
        opts = dict(mu=c.mu, gamma=c.gamma, form=c.form, diversity_kind=c.diversity, eps=c.eps_div,
                    sd_formula=c.sd_formula, div_direction=c.div_direction,
                    entropy_temperature=c.entropy_temperature)
        terms: dict[str, torch.Tensor] = {}
        if c.ranking == "triplet":  # the GPO base's objective: VSE∞'s hinge, summed hinges in the warm-up
            terms["instance"] = triplet_loss(v_i @ w_i.t(), positives, c.margin, epoch >= c.warmup_epochs, "sum")
        else:
            inst = dcl_loss(v_i, w_i, w_i, v_i, neg, neg.t(), **opts)
            terms["instance"], terms["div_i2t"] = inst["loss"], inst["div_i2t"]
        loss = c.weight_instance * terms["instance"]
        if c.weight_memory > 0:
            terms["memory"] = self._memory_loss(out, v_i, w_i, neg, opts)
            loss = loss + c.weight_memory * terms["memory"]
        if self.concept_enabled:
            v_c, w_c = img[:, 1], txt[:, 1]
            if c.weight_concept > 0:
                terms["concept"] = dcl_loss(v_c, w_c, w_c, v_c, neg, neg.t(), **opts)["loss"]
                loss = loss + c.weight_concept * terms["concept"]
            if c.weight_pseudo_label > 0:
                terms["pseudo_label"] = self._pseudo_label_loss(out, v_c, w_c)
                loss = loss + c.weight_pseudo_label * terms["pseudo_label"]
        return {"loss": loss, **terms}

    def _memory_loss(self, out: dict, v_i: torch.Tensor, w_i: torch.Tensor, neg: torch.Tensor, opts: dict
                     ) -> torch.Tensor:
        """DCL against the momentum keys of the batch, then the queue."""
        b, image_index = v_i.shape[0], out["image_index"]
        valid_q = self.queue_image >= 0
        q_neg = valid_q[None, :].expand(b, -1)
        if self.loss_settings.queue_mask_same_image:  # queued keys of the anchor's own image are not negatives
            q_neg = q_neg & (self.queue_image[None, :] != image_index[:, None])
        neg_i = torch.cat([neg, q_neg], dim=1)
        neg_t = torch.cat([neg.t(), q_neg], dim=1)
        cand_txt = torch.cat([out["key_txt"], self.queue_txt], dim=0)
        cand_img = torch.cat([out["key_img"], self.queue_img], dim=0)
        return dcl_loss(v_i, cand_txt, w_i, cand_img, neg_i, neg_t, **opts)["loss"]

    def _pseudo_label_loss(self, out: dict, v_c: torch.Tensor, w_c: torch.Tensor) -> torch.Tensor:
        """Sinkhorn codes of the momentum instance keys, predicted from the concept embeddings."""
        c = self.loss_settings
        protos = F.normalize(self.prototypes.weight, dim=1)
        codes_img = sinkhorn_codes(out["key_img"] @ protos.detach().t(), c.sinkhorn_epsilon, c.sinkhorn_iterations)
        codes_txt = sinkhorn_codes(out["key_txt"] @ protos.detach().t(), c.sinkhorn_epsilon, c.sinkhorn_iterations)
        if c.pl_cross_modal:
            codes_img, codes_txt = codes_txt, codes_img
        tau = c.prototype_temperature
        return (pseudo_label_loss(v_c @ protos.t() / tau, codes_img)
                + pseudo_label_loss(w_c @ protos.t() / tau, codes_txt))

    @torch.no_grad()
    def on_train_step_end(self, out: dict[str, torch.Tensor]) -> None:
        """EMA of the key encoders, enqueue this step's keys (from its forward's ``out``), re-normalise the
        prototypes."""
        if self.concept_enabled:
            self.prototypes.weight.copy_(F.normalize(self.prototypes.weight, dim=1))
        if not self.momentum_enabled:
            return
        m = self.model_settings.momentum
        for online, key in self._key_pairs():
            for p_k, p_o in zip(key.parameters(), online.parameters()):
                p_k.mul_(m).add_(p_o.detach(), alpha=1 - m)
            for b_k, b_o in zip(key.buffers(), online.buffers()):
                b_k.copy_(b_o)
        if "key_img" in out and self.queue_img.shape[0] > 0:
            key_img, key_txt, image_index = out["key_img"], out["key_txt"], out["image_index"]
            k = self.queue_img.shape[0]
            n = min(key_img.shape[0], k)
            idx = (self.queue_ptr + torch.arange(n, device=key_img.device)) % k
            self.queue_img[idx] = key_img[-n:].to(self.queue_img.dtype)
            self.queue_txt[idx] = key_txt[-n:].to(self.queue_txt.dtype)
            self.queue_image[idx] = image_index[-n:]
            self.queue_ptr.copy_((self.queue_ptr + n) % k)

    # -- evaluation -------------------------------------------------------------------------------------------------
    def similarity_matrix(self, img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        from xmr.similarity.measures import compute_similarity

        alpha = self.model_settings.fusion_alpha
        sims = compute_similarity(img[:, 0], txt[:, 0], measure="cosine")
        if alpha < 1:
            sims = alpha * sims + (1 - alpha) * compute_similarity(img[:, 1], txt[:, 1], measure="cosine")
        return sims


def _checked_image_index(index: torch.Tensor | None, batch_size: int, device: torch.device) -> torch.Tensor:
    """(B,) long copy of a training forward's ``image_index``, checked against the batch."""
    if index is None:
        raise XmrError("coder: a training forward needs the batch's dataset image indices; the trainer passes "
                       "them, a caller calls model(feats, num_regions, text, image_index) ((B,) long)")
    index = torch.as_tensor(index)
    if index.shape != (batch_size,) or index.is_floating_point() or index.dtype == torch.bool:
        raise XmrError(f"coder: image_index must be a ({batch_size},) integer tensor for this batch, "
                       f"got {tuple(index.shape)} {index.dtype}; pass the batch's image indices")
    return index.detach().to(device=device, dtype=torch.long).clone()
