"""Re-rankers judged with their scale: FR, the inverted softmax and DSL on the matrix rescaled to a reference spread
with the run's *validation* statistics (``fr_val``, ``isoftmax_val``, ``dsl_val``).

FR's γ/λ, the inverted softmax's β and DSL's τ are temperatures on similarity values: they assume the spread of a
trained model's cosines on the paper's data. A matrix whose similarities all lie in a band a hundredth wide (a
nearly collapsed model) meets those temperatures as if they were ~100 times smaller, and the re-ranker barely acts;
one with a wide spread meets them as sharper. The ``_val`` readings first map

    A' = μ_val + (A - μ_val) · σ_ref / σ_val

with the mean μ_val and std σ_val of the run's validation similarity matrix at its best epoch (train.json
``val_similarity``, passed in at the edge by :func:`xmr.run.results.evaluate_run` as ``val_mean`` / ``val_std``), so
that the validation matrix would have std ``reference_std`` (σ_ref), then apply the re-ranker with the paper's
parameters. The test matrix itself is not used for the statistics (no transduction beyond what the re-ranker does).
Rankings of the plain matrix are unchanged by the map (an increasing affine function); the re-rankers' are not.

``reference_std`` = 0.1 is a reading, not a paper value [I]: the order of the std of the cosine similarities of a
trained VSE-style model on COCO/Flickr30K, where the paper tuned γ = 25. The paper's fixed parameters stay the
default (``fr``, ``isoftmax``, ``dsl``).
"""

from __future__ import annotations

import math

import xmr.rerank.dual_softmax  # noqa: F401  (the base re-rankers are registered before their readings)
import xmr.rerank.fast  # noqa: F401
import xmr.rerank.inverted_softmax  # noqa: F401
from xmr.core.errors import XmrError
from xmr.core.lazy import torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.rerank.base import RERANKERS, RerankContext, RerankerSpec, Rescoring

#: parameters every ``_val`` reading adds to its base re-ranker's
SCALE_DEFAULTS = {"val_mean": 0.0, "val_std": 0.0, "reference_std": 0.1}


def rescale_to_reference(sims: torch.Tensor, val_mean: float, val_std: float, reference_std: float) -> torch.Tensor:
    """``val_mean + (sims - val_mean) * reference_std / val_std`` (float32, a new tensor)."""
    return (sims.double() - val_mean).mul_(reference_std / val_std).add_(val_mean).float()


def _reading(base: str):
    def prepare(sims: torch.Tensor, p: dict, ctx: RerankContext) -> Rescoring:
        name = f"{base}_val"
        if not (math.isfinite(p["val_std"]) and p["val_std"] > 0):
            raise XmrError(f"re-ranker {name!r}: val_std={p['val_std']} must be > 0: the std of the run's validation "
                           f"similarities (train.json val_similarity, written by the trainer since early stopping); "
                           f"evaluate a run trained by this version, or pass --rerank-param val_mean=.. val_std=..")
        if not p["reference_std"] > 0:
            raise XmrError(f"re-ranker {name!r}: reference_std must be > 0, got {p['reference_std']}")
        inner = {k: v for k, v in p.items() if k not in SCALE_DEFAULTS}
        scaled = rescale_to_reference(sims, p["val_mean"], p["val_std"], p["reference_std"])
        return RERANKERS.get(base).prepare(scaled, inner, ctx)
    return prepare


for _base in ("fr", "isoftmax", "dsl"):
    _spec = RERANKERS.get(_base)
    RERANKERS.register(f"{_base}_val")(RerankerSpec(
        name=f"{_base}_val",
        summary=f"{_base} on the matrix rescaled to std reference_std with the run's validation statistics",
        defaults={**_spec.defaults, **SCALE_DEFAULTS},
        choices=dict(_spec.choices),
        prepare=_reading(_base),
        source=_spec.source + "; rescaling: xmr (docs/benchmark.md, FR judged with its scale)",
        rows_of=_base,
    ))
