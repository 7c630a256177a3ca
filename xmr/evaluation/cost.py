"""Inference cost as the seed papers count it (``benchmarks/bench_cost.py`` writes docs/speed.md "Inference cost"):

- ``count_flops(fn, *args)``: floating-point operations of one call, counted by torch's ``FlopCounterMode`` from the
  operators it runs (matmul, bmm, einsum, linear, conv, attention), in one of two conventions: ``flop`` (a
  multiply-add is 2 operations: a Linear(in, out) on a batch of B is 2·in·out·B) or ``mac`` (a multiply-add is 1:
  in·out·B). DivE §4.4 and supplement B.1 count multiply-adds: its "16.4K FLOPs" per image-caption pair is
  K·L·D = 4·4·1024 element dot products' multiply-adds, VSE∞'s one 1024-d cosine is 1,024, "a cost of 16".
- ``similarity_pair_macs(k, l, d)``: that number by formula, the cost of one set-to-set similarity (the
  element-wise reductions, max or log-sum-exp over K·L values, are not multiply-adds and are left out, as DivE does).
- ``top_k(sims, k)``: the top-``k`` retrieval of both directions on a similarity matrix (DivE B.1 times scoring
  plus top-10 retrieval).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from xmr.core.errors import XmrError

CONVENTIONS = ("flop", "mac")


def count_flops(fn: Callable[..., Any], *args: Any, convention: str = "flop", **kwargs: Any) -> int:
    """Operations of ``fn(*args, **kwargs)`` as torch's FLOP counter sees them (2 per multiply-add), or
    multiply-adds with ``convention="mac"``. Operators the counter does not know (elementwise maths, reductions,
    sorting) count 0."""
    from torch.utils.flop_counter import FlopCounterMode

    if convention not in CONVENTIONS:
        raise XmrError(f"FLOP convention {convention!r}: choose one of {', '.join(CONVENTIONS)}")
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    total = int(counter.get_total_flops())
    return total // 2 if convention == "mac" else total


def similarity_pair_macs(k: int, l: int, d: int) -> int:
    """Multiply-adds of one set-to-set similarity: the K·L element dot products of d-dimensional vectors (DivE's
    count; single vectors: k = l = 1)."""
    if min(k, l, d) < 1:
        raise XmrError(f"similarity_pair_macs needs positive K, L, D, got {k}, {l}, {d}")
    return k * l * d


def top_k(sims: torch.Tensor, k: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the ``k`` best captions of each image (N, k) and of the ``k`` best images of each caption (M, k)
    of an (N, M) similarity matrix."""
    return (sims.topk(min(k, sims.shape[1]), dim=1).indices,
            sims.topk(min(k, sims.shape[0]), dim=0).indices.T)


__all__ = ["CONVENTIONS", "count_flops", "similarity_pair_macs", "top_k"]
