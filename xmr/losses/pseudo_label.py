"""Online-clustering pseudo labels and their prediction loss (CODER's concept-branch supervision).

CODER's abstract says the instance branch "generates pseudo online clustering labels" and the concept branch is
trained to predict them; the design is not published. Following the method card (§1.6), the codes are SwAV's
(Caron et al., 2020): equal-partition soft assignments of a batch to prototypes by Sinkhorn-Knopp.
"""

from __future__ import annotations

import torch


@torch.no_grad()
def sinkhorn_codes(scores: torch.Tensor, epsilon: float = 0.05, iterations: int = 3) -> torch.Tensor:
    """(B, P) soft codes from prototype scores: rows sum to 1, and the P prototypes share the B samples equally.

    Q = exp(scores/ε)ᵀ is alternately rescaled so that its rows (prototypes) sum to 1/P and its columns (samples)
    to 1/B; the result is returned per sample (columns scaled back to sum 1).
    """
    q = torch.exp((scores.float() - scores.float().max()) / epsilon).t()  # (P, B); the shift cancels out
    q = q / q.sum()
    p, b = q.shape
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / p
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).t()


def pseudo_label_loss(logits: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Mean over samples of the cross-entropy -Σ_k codes_k log softmax(logits)_k."""
    return -(codes * torch.log_softmax(logits, dim=1)).sum(1).mean()
