"""One evaluator for every method: ranks and recall metrics from a similarity matrix (rows=images, cols=captions)."""

from xmr.evaluation.metrics import evaluate_sims

__all__ = ["evaluate_sims"]
