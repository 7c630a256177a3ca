"""Diversity-sensitive contrastive learning (DCL) of CODER (Wang et al., ECCV 2022; supplement §1.3, Eqs. 7-9).

One direction, anchors n = 1..N against candidates q = 1..Q (similarities ``S`` (N, Q), one positive per row):

    l_DCL = (μ/N) Σ_n [ log(1 + Σ_{q neg} exp((S_nq - γ) / (μ·div_n))) - log(S_n,pos + 1) ]

and the full loss is the sum of the image->text and text->image directions. ``div_n`` is the anchor's diversity,
a detached per-anchor weight estimated from its negative similarities:

- ``std`` (Eq. 7):     div = 1 / sigmoid(ε / SD_n), divided by its maximum over the batch anchors;
- ``entropy`` (Eq. 8): the same with SD replaced by the entropy (bits) of softmax(S_n,neg / temperature);
- ``none``:            div = 1 (Table 3's "no explicit estimation" row).

The printed SD, sqrt(E[S] - E[S]²), is not a standard deviation (and is NaN for a negative mean);
``sd_formula="std"`` (default) uses sqrt(E[S²] - E[S]²), ``"printed"`` the printed form clamped at 0.
``direction="inverse"`` inverts the score (the prose's reading, where flat anchors get the largest diversity).
``form`` selects the literal Eq. 9 or the two fallbacks of the method card (``relative``: a smooth
max-violation triplet; ``infonce``: InfoNCE with per-anchor temperature μ·div).
"""

from __future__ import annotations

import torch

from xmr.core.errors import XmrError


def diversity(sims: torch.Tensor, neg_mask: torch.Tensor, kind: str = "std", eps: float = 0.1,
              sd_formula: str = "std", direction: str = "formula", entropy_temperature: float = 1.0) -> torch.Tensor:
    """(N,) detached diversity weights in (0, 1] of the anchors (rows) of ``sims`` over their negatives."""
    with torch.no_grad():
        s = sims.detach().float()
        if kind == "none":
            return torch.ones(s.shape[0], device=s.device)
        m = neg_mask.float()
        n = m.sum(1).clamp(min=1)
        if kind == "std":
            mean = (s * m).sum(1) / n
            if sd_formula == "std":
                var = (((s - mean[:, None]) ** 2) * m).sum(1) / n
            elif sd_formula == "printed":
                var = mean - mean**2
            else:
                raise XmrError(f"loss.sd_formula: expected std or printed, got {sd_formula!r}")
            stat = var.clamp(min=1e-12).sqrt()
        elif kind == "entropy":
            logits = (s / entropy_temperature).masked_fill(~neg_mask, float("-inf"))
            p = torch.softmax(logits, dim=1)
            stat = (-(p * torch.log2(p.clamp(min=1e-30))).sum(1)).clamp(min=1e-12)
        else:
            raise XmrError(f"loss.diversity: expected std, entropy or none, got {kind!r}")
        div = 1.0 / torch.sigmoid(eps / stat)  # in (1, 2)
        if direction == "inverse":
            div = 1.0 / div
        elif direction != "formula":
            raise XmrError(f"loss.div_direction: expected formula or inverse, got {direction!r}")
        return div / div.max()


def dcl_direction(sims: torch.Tensor, pos_index: torch.Tensor, neg_mask: torch.Tensor, div: torch.Tensor,
                  mu: float, gamma: float, form: str = "literal") -> torch.Tensor:
    """One direction of DCL, averaged over the N anchors. ``pos_index`` (N,) is each row's positive column."""
    pos = sims.gather(1, pos_index[:, None]).squeeze(1)
    temp = mu * div[:, None]
    if form == "infonce":
        logits = (sims / temp).masked_fill(~(neg_mask.scatter(1, pos_index[:, None], True)), float("-inf"))
        return -(torch.log_softmax(logits, dim=1).gather(1, pos_index[:, None])).mean()
    if form == "literal":
        neg = (sims - gamma) / temp
    elif form == "relative":
        neg = (sims - pos[:, None] + gamma) / temp
    else:
        raise XmrError(f"loss.form: expected literal, relative or infonce, got {form!r}")
    neg = neg.masked_fill(~neg_mask, float("-inf"))
    zero = torch.zeros_like(neg[:, :1])
    softplus_lse = torch.logsumexp(torch.cat([neg, zero], dim=1), dim=1)  # log(1 + Σ exp(.))
    if form == "relative":
        return (mu * softplus_lse).mean()
    return (mu * (softplus_lse - torch.log((pos + 1).clamp(min=1e-6)))).mean()


def dcl_loss(img: torch.Tensor, txt_keys: torch.Tensor, txt: torch.Tensor, img_keys: torch.Tensor,
             neg_mask_i2t: torch.Tensor, neg_mask_t2i: torch.Tensor, *, mu: float, gamma: float,
             form: str = "literal", diversity_kind: str = "std", eps: float = 0.1, sd_formula: str = "std",
             div_direction: str = "formula", entropy_temperature: float = 1.0) -> dict[str, torch.Tensor]:
    """Bidirectional DCL: image anchors ``img`` (B, D) against text candidates ``txt_keys`` (Q, D) and text anchors
    ``txt`` (B, D) against image candidates ``img_keys`` (Q, D); anchor n's positive is candidate n.

    In-batch DCL passes the batch itself as candidates (Q = B); the memory-bank loss passes momentum keys of the
    batch followed by the queue. ``neg_mask_*`` (B, Q) marks valid negatives. Returns ``loss`` (sum of the two
    directions, Eq. 9) and the mean diversity per direction.
    """
    b = img.shape[0]
    pos_index = torch.arange(b, device=img.device)
    s_i2t, s_t2i = img @ txt_keys.t(), txt @ img_keys.t()
    opts = dict(kind=diversity_kind, eps=eps, sd_formula=sd_formula, direction=div_direction,
                entropy_temperature=entropy_temperature)
    div_i, div_t = diversity(s_i2t, neg_mask_i2t, **opts), diversity(s_t2i, neg_mask_t2i, **opts)
    loss = (dcl_direction(s_i2t, pos_index, neg_mask_i2t, div_i, mu, gamma, form)
            + dcl_direction(s_t2i, pos_index, neg_mask_t2i, div_t, mu, gamma, form))
    return {"loss": loss, "div_i2t": div_i.mean(), "div_t2i": div_t.mean()}
