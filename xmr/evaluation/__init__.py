"""One evaluator for every method: ranks and recall metrics from a similarity matrix (rows = images, columns =
captions), with optional re-ranking (:mod:`xmr.rerank`). See ``docs/evaluation.md``."""

from xmr.evaluation.metrics import class_metrics, mean_of, recall_metrics, rsum
from xmr.evaluation.protocols import PROTOCOLS, Protocol, check_matrix, evaluate_sims, get_protocol
from xmr.evaluation.ranks import (TIE_POLICIES, first_positive_rank, grouped_ranks, i2t_ranks, label_ranks,
                                  r_precision, t2i_ranks)

__all__ = ["evaluate_sims", "PROTOCOLS", "Protocol", "get_protocol", "check_matrix", "TIE_POLICIES", "grouped_ranks",
           "i2t_ranks", "t2i_ranks", "label_ranks", "first_positive_rank", "r_precision", "recall_metrics", "rsum",
           "class_metrics", "mean_of"]
