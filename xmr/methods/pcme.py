"""PCME (Chun et al., CVPR'21): probabilistic cross-modal embeddings trained with a soft contrastive loss.

Each image and caption is a Gaussian N(μ, diag σ²) in the joint space:

- mean μ: the PIE head (PVSE's one-head self-attention residual added to a global feature, LayerNorm,
  L2-normalised), from :mod:`xmr.models.set_heads`;
- log σ: PCME's uncertainty module, a second one-head attention over the same local features, FC, plus a
  global branch (image: FC of the average-pooled features; caption: a BiGRU over the local features (released
  code) or an FC of the sentence vector), not normalised.

Training draws J samples per item (reparameterised) and minimises the soft contrastive loss of
:mod:`xmr.losses.probabilistic` + β·KL(N(μ, σ²) ‖ N(0, I)) (+ an optional uniformity term, released CUB config).

Interface with the trainer: in training mode ``encode_image``/``encode_text`` return (B, 2, D) = [μ, log σ]
(one tensor, as the trainer expects) and ``compute_loss`` samples; in eval mode they return what
``model.pcme_score`` ranks by: J samples (B, J, D) drawn with fixed noise (``log_match_prob``, ``match_prob``,
``sample_mean_dot``) or μ (B, D) (``mean_cosine``). The default test score is the log of the match probability
(``log_match_prob``): the paper's ranking, without the float32 underflow that ties far pairs at probability 0.

Training-time caption augmentation (released ``caption_drop_prob: 0.1``): each word becomes <unk> with prob p,
then ⌊p·n⌋ of the n words are deleted (:mod:`xmr.models.augment`, ``unk_then_delete``; training mode only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from xmr.config.loader import method_schema
from xmr.core.errors import XmrError
from xmr.losses.probabilistic import (gaussian_kl_to_standard, released_vib_kl, sample_gaussian,
                                      soft_contrastive_loss, uniformity_loss)
from xmr.methods.base import METHODS, MethodSettings, RetrievalModel
from xmr.models.augment import augment_caption_batch
from xmr.models.pooling import mean_pool
from xmr.models.set_heads import MultiHeadSelfAttention, PIENet, last_pool, text_global_and_local, text_local_dim

# pcme_score -> the xmr.similarity.measures measure eval.similarity must name (or "model")
SCORE_MEASURES = {"log_match_prob": "log_match_prob", "match_prob": "match_prob", "mean_cosine": "cosine",
                  "sample_mean_dot": "mean"}
# re-rankers that must be told (parameter scores: log_prob) that the matrix holds log-probabilities
LOG_SCORE_RERANKERS = ("dsl", "mr")
# match_sigmoid -> k in σ(x) = logistic(k·x)
LOGIT_SCALES = {"released": 2.0, "paper": 1.0}


class UncertaintyHead(nn.Module):
    """PCME's uncertainty module: log σ = FC(one-head attention pool of the local features) + a global term."""

    def __init__(self, in_dim: int, embed_dim: int, hidden_dim: int | None = None) -> None:
        super().__init__()
        self.attention = MultiHeadSelfAttention(1, in_dim, hidden_dim or max(1, in_dim // 2))
        self.fc = nn.Linear(in_dim, embed_dim)
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, local: torch.Tensor, lengths: torch.Tensor, global_term: torch.Tensor) -> torch.Tensor:
        pooled, _ = self.attention(local, lengths)
        return self.fc(pooled[:, 0]) + global_term


class LastStepBiGRU(nn.Module):
    """BiGRU (hidden D/2 per direction, concatenated) read at the last valid step: the released text sigma branch."""

    def __init__(self, in_dim: int, embed_dim: int) -> None:
        super().__init__()
        if embed_dim % 2:
            raise XmrError(f"model.embed_dim: {embed_dim} is odd; model.text_sigma_branch 'gru' concatenates two "
                           f"directions of D/2, so use an even embed_dim or text_sigma_branch: linear")
        self.rnn = nn.GRU(in_dim, embed_dim // 2, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        h, _ = pad_packed_sequence(self.rnn(packed)[0], batch_first=True, total_length=x.shape[1])
        return last_pool(h, lengths)


@dataclass(frozen=True)
class PCMEModel:
    """The ``model`` section (:attr:`PCME.schema`)."""
    embed_dim: int
    num_samples: int
    num_samples_eval: int
    eval_seed: int
    pcme_score: str
    init_scale: float
    init_shift: float
    match_sigmoid: str
    pie_dropout: float
    attention_hidden: int | None
    text_pool: str
    text_attention_input: str
    text_sigma_branch: str
    text_augment: float
    text_augment_style: str


@dataclass(frozen=True)
class PCMELoss:
    """The ``loss`` section (:attr:`PCME.schema`)."""
    vib_beta: float
    vib_kl: str
    reduction: str
    count_both_directions: bool
    uniform_weight: float


@METHODS.register("pcme")
class PCME(RetrievalModel):
    model_settings_class, loss_settings_class = PCMEModel, PCMELoss
    gathered_loss = True  # the loss reads only (img, txt, positives): DDP may gather the global batch
    schema = method_schema("pcme")

    def __init__(self, settings: MethodSettings, image_dim: int, vocab_words: list[str] | None) -> None:
        super().__init__(settings, image_dim, vocab_words)
        m = self.model_settings
        d = self.embed_dim
        need = SCORE_MEASURES[m.pcme_score]
        if self.scoring.similarity not in (need, "model"):
            raise XmrError(f"eval.similarity: {self.scoring.similarity!r} does not fit model.pcme_score "
                           f"{m.pcme_score!r}; set eval.similarity: {need}")
        want = "log_prob" if need == "log_match_prob" else "similarity"
        for name in LOG_SCORE_RERANKERS:
            params = self.scoring.rerank.get(name)
            if isinstance(params, dict) and params.get("scores", "similarity") != want:
                raise XmrError(f"eval.rerank.{name}.scores: {params.get('scores', 'similarity')!r} does not fit "
                               f"model.pcme_score {m.pcme_score!r}; set eval.rerank.{name}.scores: {want}")
        self.logit_scale = LOGIT_SCALES[m.match_sigmoid]
        # image: global = FC(avg-pooled features); mean = PIE on the local features; log σ = uncertainty head
        self.image_fc = nn.Linear(image_dim, d)
        hidden = m.attention_hidden
        self.image_pie = PIENet(1, image_dim, d, hidden_dim=hidden, dropout=m.pie_dropout)
        self.image_sigma = UncertaintyHead(image_dim, d, hidden)
        self.image_sigma_global = nn.Linear(image_dim, d)
        # caption: the shared text encoder gives the sentence vector; heads read words or its outputs
        self.text = self.build_text_encoder()
        local_dim = text_local_dim(self.text, m.text_attention_input)
        self.text_pie = PIENet(1, local_dim, d, hidden_dim=hidden, dropout=m.pie_dropout)
        self.text_sigma = UncertaintyHead(local_dim, d, hidden)
        self.text_sigma_global: nn.Module = (LastStepBiGRU(local_dim, d) if m.text_sigma_branch == "gru"
                                             else nn.Linear(d, d))
        # a and b of σ(-a·d + b), learned with the encoders
        self.scale = nn.Parameter(torch.tensor(float(m.init_scale)))
        self.shift = nn.Parameter(torch.tensor(float(m.init_shift)))

    # -- distributions ----------------------------------------------------------------------------
    def image_distribution(self, feats: torch.Tensor, num_regions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ (B, D) unit norm, log σ (B, D)) of a batch of images."""
        pooled = mean_pool(feats, num_regions)
        mu = self.image_pie(self.image_fc(pooled), feats, num_regions)["embeddings"][:, 0]
        log_sigma = self.image_sigma(feats, num_regions, self.image_sigma_global(pooled))
        return nn.functional.normalize(mu, dim=-1), log_sigma

    def text_distribution(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(μ (B, D) unit norm, log σ (B, D)) of a batch of captions (word-drop augmented in training mode)."""
        m = self.model_settings
        if self.training:
            batch = augment_caption_batch(batch, self.text, m.text_augment, m.text_augment_style)
        glob, local, lengths = text_global_and_local(self.text, batch, m.text_pool, m.text_attention_input)
        mu = self.text_pie(glob, local, lengths)["embeddings"][:, 0]
        sigma_global = (self.text_sigma_global(local, lengths) if m.text_sigma_branch == "gru"
                        else self.text_sigma_global(glob))
        log_sigma = self.text_sigma(local, lengths, sigma_global)
        return nn.functional.normalize(mu, dim=-1), log_sigma

    def eval_noise(self, modality: int, device: torch.device) -> torch.Tensor:
        """Fixed test-time ε (J, D), the same for every item of a modality (0 images, 1 captions).

        Drawn on the CPU from ``model.eval_seed`` so scores do not depend (beyond float rounding) on the device,
        the eval batch size or the encoding order; images and captions get different noise.
        """
        j = self.model_settings.num_samples_eval
        gen = torch.Generator().manual_seed(int(self.model_settings.eval_seed))
        noise = torch.randn(2, j, self.embed_dim, generator=gen)
        return noise[modality].to(device)

    def _output(self, mu: torch.Tensor, log_sigma: torch.Tensor, modality: int) -> torch.Tensor:
        if self.training:
            return torch.stack([mu, log_sigma], dim=1)
        if self.model_settings.pcme_score == "mean_cosine":
            return mu
        return sample_gaussian(mu, log_sigma, self.model_settings.num_samples_eval,
                               noise=self.eval_noise(modality, mu.device))

    # -- RetrievalModel ---------------------------------------------------------------------------
    def encode_image(self, feats, num_regions):
        return self._output(*self.image_distribution(feats, num_regions), modality=0)

    def encode_text(self, batch):
        return self._output(*self.text_distribution(batch), modality=1)

    def compute_loss(self, out, positives, epoch):
        img, txt = out["img"], out["txt"]
        if img.ndim != 3 or img.shape[1] != 2 or txt.ndim != 3 or txt.shape[1] != 2:
            raise XmrError("pcme.compute_loss expects the training-mode outputs [μ, log σ] of shape (B, 2, D); "
                           "call it on encode_image/encode_text outputs with the model in train mode")
        lc, j = self.loss_settings, self.model_settings.num_samples
        (img_mu, img_ls), (txt_mu, txt_ls) = img.unbind(1), txt.unbind(1)
        img_z = sample_gaussian(img_mu, img_ls, j)
        txt_z = sample_gaussian(txt_mu, txt_ls, j)
        match = soft_contrastive_loss(img_z, txt_z, positives, self.scale, self.shift, self.logit_scale,
                                      lc.reduction)
        directions = 2.0 if lc.count_both_directions else 1.0
        if lc.vib_kl == "gaussian":
            kl = gaussian_kl_to_standard(img_mu, img_ls) + gaussian_kl_to_standard(txt_mu, txt_ls)
        else:
            kl = released_vib_kl(img_z, img_ls) + released_vib_kl(txt_z, txt_ls)
        if lc.reduction == "mean":
            kl = kl / img_mu.shape[0]
        loss = directions * match["loss"] + lc.vib_beta * kl
        terms = {"match_pos": match["pos"].detach(), "match_neg": match["neg"].detach(), "kl": kl.detach(),
                 "scale_a": self.scale.detach(), "shift_b": self.shift.detach(),
                 "sigma_mean": torch.cat([img_ls, txt_ls]).exp().mean().detach()}
        if lc.uniform_weight:
            unif = uniformity_loss(torch.cat([img_z.flatten(0, 1), txt_z.flatten(0, 1)]))
            loss = loss + lc.uniform_weight * unif
            terms["uniformity"] = unif.detach()
        return {"loss": loss, **terms}

    @property
    def eval_similarity(self) -> str:
        """The :mod:`xmr.similarity.measures` measure the test scores are (the one ``model.pcme_score`` names)."""
        return SCORE_MEASURES[self.model_settings.pcme_score]

    def match_params(self) -> dict[str, float]:
        """(a, b) for :func:`xmr.similarity.measures.compute_similarity`'s ``match_prob``/``log_match_prob``, which
        compute logistic(2·(b - a·d)): the learned values rescaled to this model's ``match_sigmoid``."""
        half_k = self.logit_scale / 2.0
        return {"a": float(self.scale.detach()) * half_k, "b": float(self.shift.detach()) * half_k}

    def similarity_matrix(self, img: torch.Tensor, txt: torch.Tensor) -> torch.Tensor:
        from xmr.similarity.measures import compute_similarity

        score = self.model_settings.pcme_score
        if score in ("log_match_prob", "match_prob"):
            return compute_similarity(img, txt, measure=score, **self.match_params())
        if score == "sample_mean_dot":
            # mean of the J×J raw sample dot products; ranks like the released sum of them
            return compute_similarity(img, txt, measure="mean", normalize=False)
        return compute_similarity(img, txt, measure="cosine")
