"""ADOPT, the adaptive optimisation objective of VSE+2AD (Zhang et al., EACL 2023): InfoNCE over the K hardest
in-batch negatives, with K recomputed every step from batch alignment/uniformity statistics.

Two rules for K (see docs/methods/vse_2ad.md):

- ``code`` (released ``losses.py::ADCTO``, the default): γ_align = mean_i S_ii, γ_unif = mean_{i,j} exp(-S0_ij)
  with the diagonal of S0 set to 0, K = int(cos((γ_align + γ_unif) ** scale) · B) + 1, clamped to [1, B-1].
- ``paper`` (Eq. 6): γ_uniform = log mean_{i,j} exp(S_ij), K = floor(B · cos((γ_align + γ_uniform) · π/4)),
  clamped.

For each query row the K most similar non-positive keys are the negatives; the logits are
``[S_ii, S_ik1 + α, ..., S_ikK + α] / τ`` and the loss is cross-entropy with target 0, averaged over queries, then
over the two directions (code) or summed (paper).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xmr.core.errors import XmrError


def adopt_statistics(sims: torch.Tensor, rule: str = "code") -> tuple[float, float]:
    """(γ_align, γ_uniform) of a (B, B) matching-pair similarity matrix (positives on the diagonal)."""
    s = sims.detach().float()
    align = s.diagonal().mean()
    if rule == "code":
        s0 = s - torch.diag_embed(s.diagonal())
        uniform = torch.exp(-s0).mean()
    elif rule == "paper":
        uniform = torch.log(torch.exp(s).mean())
    else:
        raise XmrError(f"loss.k_rule: expected code or paper, got {rule!r}")
    return float(align), float(uniform)


def adopt_num_negatives(sims: torch.Tensor, rule: str = "code", scale: float = 1.25,
                        guard_negative_base: bool = True) -> int:
    """K for this batch (the same for both directions: the statistics are symmetric in S and Sᵀ)."""
    b = sims.shape[0]
    align, uniform = adopt_statistics(sims, rule)
    x = align + uniform
    if rule == "paper":
        k = math.floor(b * math.cos(x * math.pi / 4))
    else:
        if x < 0:
            if not guard_negative_base:
                # the released code evaluates a negative base to a fractional power: NaN, then int(NaN) fails
                raise XmrError(f"ADOPT: γ_align + γ_unif = {x:.4f} < 0 gives NaN in the released code's K rule; "
                               f"set loss.guard_negative_base: true (treats it as 0, i.e. the largest K)")
            x = 0.0
        k = int(math.cos(x ** scale) * b) + 1  # int() truncates toward zero, as the code
    return max(1, min(k, b - 1))


def adopt_direction(sims: torch.Tensor, pos_mask: torch.Tensor, k: int, tau: float, neg_margin: float,
                    diag_mask: str = "neg_inf", positive_in_denominator: bool = True) -> torch.Tensor:
    """Mean over query rows of ``sims`` (queries x keys, positive on the diagonal) of the ADOPT cross-entropy.

    ``diag_mask="zero"`` replays the code: positives are set to 0 (not excluded) before picking the top-K, so when
    many negatives are below 0 a positive can be picked as a "negative" (with its true similarity + margin).
    ``"neg_inf"`` excludes positives from the pick.
    """
    b = sims.shape[0]
    if diag_mask == "neg_inf":
        picked = sims.masked_fill(pos_mask, float("-inf"))
    elif diag_mask == "zero":
        picked = sims.masked_fill(pos_mask, 0.0)
    else:
        raise XmrError(f"loss.diag_mask: expected neg_inf or zero, got {diag_mask!r}")
    idx = picked.detach().topk(k, dim=1).indices
    neg = sims.gather(1, idx)  # the true similarities of the picked keys (the code recomputes query·key)
    if diag_mask == "neg_inf":
        # rows with fewer than k true negatives (other positives excluded) pick -inf entries: keep them out
        neg = neg.masked_fill(pos_mask.gather(1, idx), float("-inf"))
    pos = sims.diagonal()[:, None]
    neg_logits = (neg + neg_margin) / tau
    if positive_in_denominator:
        logits = torch.cat([pos / tau, neg_logits], dim=1)
        return F.cross_entropy(logits, torch.zeros(b, dtype=torch.long, device=sims.device))
    # paper Eq. as printed: -log(e^{s+/τ} / Σ_k e^{s_k/τ}) with the positive left out of the sum
    return (torch.logsumexp(neg_logits, dim=1) - pos.squeeze(1) / tau).mean()


def adopt_loss(sims: torch.Tensor, pos_mask: torch.Tensor | None = None, *, k_rule: str = "code",
               k_mode: str = "adaptive", const_k: int = 3, scale: float = 1.25, tau: float = 0.05,
               neg_margin: float = 0.2, diag_mask: str = "neg_inf", direction_reduce: str = "mean",
               positive_in_denominator: bool = True, guard_negative_base: bool = True) -> dict[str, torch.Tensor]:
    """ADOPT on a (B, B) image-caption similarity matrix (rows images, positives on the diagonal).

    ``pos_mask`` marks other true pairs (captions of the same image), treated like the diagonal.
    ``k_mode``: ``adaptive`` (the rule), ``constant`` (``const_k``) or ``random`` (K ~ U{1..B-1}, the code's extra
    modes). Returns ``loss`` and, for logging, ``k``, ``align`` and ``uniform``.
    """
    b = sims.shape[0]
    if b < 2:
        raise XmrError("ADOPT needs a batch of at least 2 pairs (train.batch_size)")
    eye = torch.eye(b, dtype=torch.bool, device=sims.device)
    pos_mask = eye if pos_mask is None else (pos_mask | eye)
    if k_mode == "adaptive":
        k = adopt_num_negatives(sims, k_rule, scale, guard_negative_base)
    elif k_mode == "constant":
        k = max(1, min(const_k, b - 1))
    elif k_mode == "random":
        k = int(torch.randint(1, b, (1,)))
    else:
        raise XmrError(f"loss.k_mode: expected adaptive, constant or random, got {k_mode!r}")
    kwargs = dict(k=k, tau=tau, neg_margin=neg_margin, diag_mask=diag_mask,
                  positive_in_denominator=positive_in_denominator)
    i2t = adopt_direction(sims, pos_mask, **kwargs)
    t2i = adopt_direction(sims.t(), pos_mask.t(), **kwargs)
    if direction_reduce not in ("mean", "sum"):
        raise XmrError(f"loss.direction_reduce: expected mean or sum, got {direction_reduce!r}")
    loss = i2t + t2i
    if direction_reduce == "mean":
        loss = loss / 2
    align, uniform = adopt_statistics(sims, k_rule)
    return {"loss": loss, "k": torch.tensor(float(k)), "align": torch.tensor(align),
            "uniform": torch.tensor(uniform)}
