"""Losses of probabilistic embeddings (PCME, Chun et al. CVPR'21), as pure functions of sampled embeddings.

An item's embedding is a Gaussian N(μ, diag σ²); the model hands over J samples z = μ + σ·ε per item. For an
image i and a caption j, with a (``scale``) and b (``shift``) learnable:

    p(match | z_i, z_j) = σ_k(-a‖z_i - z_j‖ + b)                            one pair of samples
    p(match | i, j)     ≈ 1/J² Σ_{k,l} σ_k(-a‖z_i^k - z_j^l‖ + b)           Monte-Carlo over J×J pairs
    NLL_ij              = -log p(m_ij | i, j),  p(non-match) = 1 - p(match)  soft contrastive loss

σ_k(x) = logistic(k·x): the released code writes σ(x) = eˣ/(eˣ + e⁻ˣ), i.e. k = 2 (``logit_scale=2``); the
paper's plain sigmoid is k = 1. The KL (variational information bottleneck) term pulls each N(μ, σ²) towards
N(0, I). :func:`sample_gaussian` draws the samples (reparameterised, so gradients reach μ and log σ).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xmr.core.errors import XmrError

# Inside the sqrt so its gradient stays finite at zero distance (the released code's batchwise_cdist adds 1e-6).
DISTANCE_EPS = 1e-6


def sample_gaussian(mu: torch.Tensor, log_sigma: torch.Tensor, num_samples: int,
                    noise: torch.Tensor | None = None) -> torch.Tensor:
    """(B, D) means and log standard deviations -> (B, J, D) samples μ + exp(log σ)·ε.

    ``noise``: ε of shape (B, J, D) or (J, D) (shared by every item); default: fresh draws from the global RNG.
    """
    if noise is None:
        noise = torch.randn(mu.shape[0], num_samples, mu.shape[1], dtype=mu.dtype, device=mu.device)
    elif noise.shape[-2:] != (num_samples, mu.shape[1]):
        raise XmrError(f"noise has shape {tuple(noise.shape)}; expected (..., {num_samples}, {mu.shape[1]})")
    return mu[:, None, :] + log_sigma.exp()[:, None, :] * noise.to(mu.dtype)


def pairwise_sample_distances(x: torch.Tensor, y: torch.Tensor, eps: float = DISTANCE_EPS) -> torch.Tensor:
    """sqrt(‖x - y‖² + eps) for every sample pair: x (B, J, D), y (B', L, D) -> (B, B', J, L)."""
    b, j, d = x.shape
    m, l, _ = y.shape
    dots = (x.reshape(b * j, d) @ y.reshape(m * l, d).T).view(b, j, m, l)
    sq = (x * x).sum(-1)[:, :, None, None] + (y * y).sum(-1)[None, None, :, :] - 2.0 * dots
    # rounding can make ‖x‖² + ‖y‖² - 2<x, y> slightly negative for near-identical samples
    return (sq.clamp_min(0.0) + eps).sqrt().permute(0, 2, 1, 3)


def match_logits(distances: torch.Tensor, scale: torch.Tensor | float, shift: torch.Tensor | float) -> torch.Tensor:
    """-a·d + b (the argument of the match sigmoid)."""
    return -scale * distances + shift


def soft_contrastive_nll(logits: torch.Tensor, is_match: torch.Tensor, logit_scale: float = 2.0) -> torch.Tensor:
    """-log of the Monte-Carlo match (or non-match) probability per item pair.

    ``logits`` (..., S): -a·d + b for S sample pairs; ``is_match`` (...) bool. Returns (...):
    -log( 1/S Σ_s σ_k(±logit_s) ) computed as log S - logsumexp_s(logsigmoid(±k·logit_s)), which stays finite
    where the probability underflows in float32.
    """
    sign = is_match.to(logits.dtype) * 2.0 - 1.0
    log_p = F.logsigmoid(logit_scale * sign[..., None] * logits)
    return math.log(logits.shape[-1]) - torch.logsumexp(log_p, dim=-1)


def match_probability(img_samples: torch.Tensor, txt_samples: torch.Tensor, scale: torch.Tensor | float,
                      shift: torch.Tensor | float, logit_scale: float = 2.0) -> torch.Tensor:
    """(B, B') mean over the J×L sample pairs of σ_k(-a‖z_i - z_j‖ + b) (differentiable; small batches).

    Probabilities, for inspection: in float32 they are exactly 0 for far pairs. The loss does not use them
    (:func:`soft_contrastive_nll` works in log space); test-time ranking uses ``xmr.similarity.measures``'s
    ``log_match_prob``.
    """
    logits = match_logits(pairwise_sample_distances(img_samples, txt_samples), scale, shift)
    return torch.sigmoid(logit_scale * logits).mean(dim=(-2, -1))


def soft_contrastive_loss(img_samples: torch.Tensor, txt_samples: torch.Tensor, pos_mask: torch.Tensor,
                          scale: torch.Tensor | float, shift: torch.Tensor | float, logit_scale: float = 2.0,
                          reduction: str = "sum") -> dict[str, torch.Tensor]:
    """PCME's soft contrastive loss over all B×B' image-caption pairs of a batch.

    ``pos_mask[i, j]`` True where caption j matches image i (those pairs use -log p(match), all others
    -log p(non-match)). ``reduction``: ``sum`` over pairs (released code) or ``mean`` over pairs. Returns
    ``loss`` = ``pos`` + ``neg`` (each reduced the same way).
    """
    if reduction not in ("sum", "mean"):
        raise XmrError(f"loss.reduction: {reduction!r} is not one of sum, mean")
    logits = match_logits(pairwise_sample_distances(img_samples, txt_samples), scale, shift)
    nll = soft_contrastive_nll(logits.flatten(-2), pos_mask, logit_scale)  # (B, B')
    pos = nll[pos_mask].sum()
    neg = nll[~pos_mask].sum()
    if reduction == "mean":
        pos, neg = pos / nll.numel(), neg / nll.numel()
    return {"loss": pos + neg, "pos": pos, "neg": neg}


def gaussian_kl_to_standard(mu: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """Σ over items and dimensions of KL(N(μ, diag σ²) ‖ N(0, I)) = ½ Σ (μ² + σ² - 1 - 2 log σ)."""
    return 0.5 * (mu.pow(2) + (2.0 * log_sigma).exp() - 1.0 - 2.0 * log_sigma).sum()


def released_vib_kl(samples: torch.Tensor, log_sigma: torch.Tensor) -> torch.Tensor:
    """The released code's VIB term: -½ Σ (1 + s - m² - eˢ) with m the mean of the J samples (B, J, D) and
    s = ``log_sigma`` read as a log *variance* (while the samples use it as a log standard deviation)."""
    m = samples.mean(dim=1)
    return -0.5 * (1.0 + log_sigma - m.pow(2) - log_sigma.exp()).sum()


def uniformity_loss(points: torch.Tensor, t: float = 2.0, max_points: int | None = 128) -> torch.Tensor:
    """log of the mean of exp(-t‖x_i - x_j‖²) over distinct pairs of ``points`` (N, D) (Wang & Isola 2020).

    With more than ``max_points`` points a random subset (global RNG, without replacement) is used, as the
    released PCME code does to bound memory (it draws 128 indices with replacement).
    """
    if max_points is not None and points.shape[0] > max_points:
        points = points[torch.randperm(points.shape[0], device=points.device)[:max_points]]
    return torch.pdist(points, p=2).pow(2).mul(-t).exp().mean().log()


__all__ = ["DISTANCE_EPS", "sample_gaussian", "pairwise_sample_distances", "match_logits", "soft_contrastive_nll",
           "match_probability", "soft_contrastive_loss", "gaussian_kl_to_standard", "released_vib_kl",
           "uniformity_loss"]
