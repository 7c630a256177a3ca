"""Re-ranking as post-processing of any (N images x M captions) similarity matrix.

A re-ranker gives each direction its own score matrix: ``i2t`` (rank each row, image -> text) and ``t2i`` (rank
each column, text -> image). Internally they are produced lazily, block by block, by a :class:`Rescoring`, so
the evaluator never holds a second N x M matrix (FR at COCO-5K stays within 1.5x the matrix's memory); the
public :func:`rerank` materialises both.

Registered re-rankers (``RERANKERS``; one module each, formulas and sources in ``docs/evaluation.md``):

====== ===================================================== ======================================
name   what                                                  module
====== ===================================================== ======================================
fr     DVSE Fast Re-ranking, Eqs. 13-15                      :mod:`xmr.rerank.fast`
rr     MTFN-RR cross-modal k-reciprocal re-ranking           :mod:`xmr.rerank.kreciprocal`
mr     GaLR multivariate re-ranking                          :mod:`xmr.rerank.multivariate`
isoftmax inverted softmax                                    :mod:`xmr.rerank.inverted_softmax`
dsl    dual softmax (CAMoE DSL at inference)                 :mod:`xmr.rerank.dual_softmax`
qbnorm QB-Norm with a query bank (dynamic inverted softmax)  :mod:`xmr.rerank.qbnorm`
csls   cross-domain similarity local scaling                 :mod:`xmr.rerank.csls`
fr_val FR, isoftmax, dsl on the matrix rescaled to a          :mod:`xmr.rerank.standardised`
(...)  reference spread with validation statistics
====== ===================================================== ======================================

Defaults: each re-ranker's parameters have code defaults; ``config/rerank/<name>.yaml`` (when present) holds
per-dataset rows that override them (FR's paper values per dataset live in ``config/rerank/fr.yaml``).
"""

from xmr.core.registry import import_plugins, import_submodules
from xmr.rerank.base import (DEFAULT_BLOCK_BYTES, RERANKERS, RerankContext, RerankerSpec, Rescoring, arange,
                             default_params, describe_params, full, iter_blocks, map_blocks, prepare_rerank, rerank,
                             reject_nonpositive_scores, require_log_probabilities, resolve_params, rows_name)

# Registration: every module of this package registers its re-ranker (adding one is adding a module).
import_submodules("xmr.rerank")
import_plugins()  # re-rankers defined outside the package ($XMR_PLUGINS)

__all__ = ["RERANKERS", "Rescoring", "full", "arange", "RerankContext", "RerankerSpec", "rerank", "prepare_rerank",
           "default_params", "resolve_params", "describe_params", "iter_blocks", "map_blocks",
           "reject_nonpositive_scores", "require_log_probabilities", "DEFAULT_BLOCK_BYTES", "rows_name"]
