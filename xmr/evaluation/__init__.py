"""One evaluator for every method: ranks and recall metrics from a similarity matrix (rows = images, columns =
captions), with optional re-ranking (:mod:`xmr.rerank`). See ``docs/evaluation.md``.

The names below load with their module on first use (PEP 562): the benchmark's statistics
(:mod:`xmr.evaluation.stats`, NumPy only) are read while Snakemake plans, without torch."""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_OF = {
    **dict.fromkeys(["evaluate_sims", "PROTOCOLS", "Protocol", "get_protocol", "check_matrix"], "protocols"),
    **dict.fromkeys(["TIE_POLICIES", "grouped_ranks", "i2t_ranks", "t2i_ranks", "label_ranks", "first_positive_rank",
                     "r_precision"], "ranks"),
    **dict.fromkeys(["recall_metrics", "rsum", "class_metrics", "mean_of"], "metrics"),
}

__all__ = list(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))
