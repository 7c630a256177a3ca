"""The re-ranking core: the :class:`Rescoring` interface, the ``RERANKERS`` registry and parameter resolution
(one module per re-ranker registers itself; see :mod:`xmr.rerank`)."""

from __future__ import annotations

import itertools
import os
import sys
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import numpy as np

from xmr.core.cpus import available_cpus
from xmr.core.errors import XmrError
from xmr.core.lazy import is_tensor, torch  # imported on first use: the registry loads without torch (xmr/core/lazy.py)
from xmr.core.registry import Registry

T = TypeVar("T")

# Budget for one block of the similarity matrix plus its temporaries (bool masks, re-ranked copies).
DEFAULT_BLOCK_BYTES = 64 * 2**20


def iter_blocks(n: int, bytes_per_item: int, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[slice]:
    """Consecutive slices of ``range(n)`` whose items take at most ``block_bytes`` together (at least one item)."""
    step = max(1, block_bytes // max(1, bytes_per_item))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def map_blocks(fn: Callable[[Any], T], blocks: Iterable[Any], device: str | torch.device = "cpu") -> Iterator[T]:
    """``fn(b)`` for each of ``blocks``, yielded in order; on CPU the blocks run on ``cpu_threads()``
    threads, at most that many blocks ahead of the consumer.

    The per-block work of the evaluation's passes over a matrix is mostly NumPy's vectorised loops on CPU (exp,
    compare, count): they release the GIL but use one core each, so without threads all cores but one idle
    through them. ``fn`` may write only its own block's part of a shared output; each thread holds one block's
    temporaries at a time. Combining the results in the consumer, in order, keeps reductions bit-identical to
    a serial loop."""
    it = iter(blocks)
    workers = cpu_threads() if str(device) == "cpu" or torch.device(device).type == "cpu" else 1
    if workers <= 1:
        yield from map(fn, it)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="xmr-blocks") as pool:
        pending = deque(pool.submit(fn, b) for b in itertools.islice(it, workers))
        while pending:
            done = pending.popleft().result()
            for b in itertools.islice(it, 1):
                pending.append(pool.submit(fn, b))
            yield done


def cpu_threads() -> int:
    """torch's intra-op thread count; before torch is imported (NumPy work), the default it would take:
    ``$OMP_NUM_THREADS``, else the cores this process may run on."""
    if "torch" in sys.modules:
        return torch.get_num_threads()
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return available_cpus()


def full(s: slice, n: int) -> slice:
    """``s`` with explicit start and stop within ``range(n)``."""
    start, stop, _ = s.indices(n)
    return slice(start, stop)


class Rescoring:
    """Scores of a (N, M) matrix for each direction, in blocks. This base class is the identity (no re-ranking).
    ``sims`` is a tensor, or a NumPy array on the CPU (here, and in re-rankers registered with ``numpy=True``).

    ``i2t_block(rows, cols)`` / ``t2i_block(rows, cols)`` return the image->text / text->image scores of
    ``sims[rows, cols]``; image->text ranks along rows, text->image along columns. ``i2t(rows)`` and ``t2i(cols)``
    are the whole-gallery blocks. Returned blocks may be views of ``sims``: callers must not modify them.
    Subclasses override the two ``*_block`` methods.
    """

    def __init__(self, sims: torch.Tensor, block_bytes: int = DEFAULT_BLOCK_BYTES) -> None:
        self.sims = sims
        self.block_bytes = block_bytes

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.sims.shape)  # type: ignore[return-value]

    def i2t_block(self, rows: slice, cols: slice) -> torch.Tensor:
        return self.sims[rows, cols]

    def t2i_block(self, rows: slice, cols: slice) -> torch.Tensor:
        return self.sims[rows, cols]

    @property
    def same_scores(self) -> bool:
        """Both directions score alike (identity, CSLS), so one block serves both."""
        cls = type(self)
        return cls.i2t_block is cls.t2i_block or (cls.i2t_block is Rescoring.i2t_block
                                                  and cls.t2i_block is Rescoring.t2i_block)

    def i2t(self, rows: slice) -> torch.Tensor:
        n, m = self.shape
        return self.i2t_block(full(rows, n), slice(0, m))

    def t2i(self, cols: slice) -> torch.Tensor:
        n, m = self.shape
        return self.t2i_block(slice(0, n), full(cols, m))

    def row_blocks(self, factor: int = 3) -> Iterator[slice]:
        n, m = self.shape
        return iter_blocks(n, m * 4 * factor, self.block_bytes)

    def col_blocks(self, factor: int = 3) -> Iterator[slice]:
        n, m = self.shape
        return iter_blocks(m, n * 4 * factor, self.block_bytes)

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Full (N, M) i2t and t2i score matrices."""
        n, m = self.shape
        cat = torch.cat if is_tensor(self.sims) else np.concatenate
        i2t = cat([self.i2t(r) for r in self.row_blocks()], 0)
        t2i = cat([self.t2i_block(r, slice(0, m)) for r in self.row_blocks()], 0)
        return i2t, t2i


def arange(s: slice, device: torch.device) -> torch.Tensor:
    return torch.arange(s.start, s.stop, device=device)


@dataclass(frozen=True)
class RerankContext:
    """What a re-ranker may know besides the matrix."""

    captions_per_image: int | None = None
    # Where this matrix sits inside the full test matrix (COCO-1K folds), so a query bank can be sliced to it.
    rows: slice | None = None
    cols: slice | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES


@dataclass(frozen=True)
class RerankerSpec:
    """A registered re-ranker: parameter defaults (their types drive CLI parsing) and a ``prepare`` function."""

    name: str
    summary: str
    defaults: Mapping[str, Any]
    prepare: Callable[[torch.Tensor, dict, RerankContext], Rescoring]
    choices: Mapping[str, tuple] = field(default_factory=dict)  # allowed values of string parameters
    source: str = ""
    # parameters read from files in the run directory, made by a workflow rule (QB-Norm's query bank):
    # {parameter: file name}; the workflow passes them as `--rerank-param parameter=runs/.../file`
    run_inputs: Mapping[str, str] = field(default_factory=dict)
    rows_of: str | None = None  # another re-ranker whose config/rerank/<name>.yaml rows apply (a reading of it)
    # ``prepare`` takes a NumPy matrix on the CPU (and its Rescoring gives NumPy blocks); otherwise the evaluator
    # hands it a tensor
    numpy: bool = False


RERANKERS: Registry[RerankerSpec] = Registry("re-ranker")


def rows_name(name: str) -> str:
    """The name of the ``config/rerank/<name>.yaml`` file whose rows give ``name``'s per-dataset defaults."""
    return RERANKERS.get(name).rows_of or name


# -- parameters ------------------------------------------------------------------------------------------------

def default_params(name: str, dataset: str | None = None, rows: Mapping[str, Any] | None = None,
                   source: str | None = None) -> dict[str, Any]:
    """All parameters of re-ranker ``name`` with their defaults for ``dataset``: the code defaults, overridden by
    the row ``dataset`` of ``rows`` (the mapping of ``config/rerank/<name>.yaml``, read by the caller with
    :func:`xmr.config.loader.load_rerank_rows`; its ``default`` row when there is none for ``dataset``)."""
    spec = RERANKERS.get(name)
    out = dict(spec.defaults)
    rows = rows or {}
    source = source or f"config/rerank/{name}.yaml"
    row = rows.get(dataset) if dataset is not None else None
    if row is None:
        row = rows.get("default", {})
    if not isinstance(row, dict):
        raise XmrError(f"{source}: row {dataset!r} must be a mapping of parameter: value")
    unknown = set(row) - set(spec.defaults)
    if unknown:
        raise XmrError(f"{source}: unknown parameter(s) {', '.join(sorted(unknown))} for re-ranker {name!r}; "
                       f"known: {', '.join(sorted(spec.defaults))}")
    out.update(row)
    return out


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(name: str, key: str, value: Any, default: Any) -> Any:
    """Convert a (possibly string, from the CLI) value to the type of the default."""
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() in _TRUE:
                    return True
                if value.lower() in _FALSE:
                    return False
                raise ValueError
            return bool(value)
        if isinstance(default, int):
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        if isinstance(default, float):
            f = float(value)
            if not np.isfinite(f):
                raise ValueError
            return f
        if isinstance(default, str):
            return str(value)
    except (TypeError, ValueError):
        kind = type(default).__name__
        raise XmrError(f"re-ranker {name!r}: parameter {key}={value!r} is not a valid {kind}") from None
    return value  # default None: arrays, paths


def resolve_params(name: str, params: Mapping[str, Any] | None = None, dataset: str | None = None,
                   rows: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults for ``dataset`` (see :func:`default_params`) overridden by ``params``; unknown names and bad values
    raise XmrError."""
    spec = RERANKERS.get(name)
    out = default_params(name, dataset, rows)
    for key, value in (params or {}).items():
        if key not in spec.defaults:
            raise XmrError(f"unknown parameter {key!r} for re-ranker {name!r}; "
                           f"known: {', '.join(sorted(spec.defaults)) or '(none)'}")
        out[key] = _coerce(name, key, value, spec.defaults[key])
    for key, allowed in spec.choices.items():
        if out[key] not in allowed:
            raise XmrError(f"re-ranker {name!r}: {key}={out[key]!r} is not one of {', '.join(map(str, allowed))}")
    return out


def describe_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-friendly copy of resolved parameters (arrays are replaced by their shape)."""
    out = {}
    for k, v in params.items():
        if isinstance(v, np.ndarray) or is_tensor(v):
            out[k] = f"array{tuple(v.shape)}"
        else:
            out[k] = v
    return out


# -- entry points ----------------------------------------------------------------------------------------------

def _as_matrix(sims) -> torch.Tensor:
    t = sims if isinstance(sims, torch.Tensor) else torch.as_tensor(np.asarray(sims))
    if t.ndim != 2:
        raise XmrError(f"similarity matrix must be 2-D (images x captions), got shape {tuple(t.shape)}")
    if t.dtype != torch.float32:
        t = t.float()
    from xmr.similarity.measures import all_finite

    if not all_finite(t):
        raise XmrError("similarity matrix contains NaN or inf values")
    return t


def reject_nonpositive_scores(sims: torch.Tensor, name: str, why: str) -> None:
    """Error when the matrix looks like log-probabilities (PCME's ``log_match_prob``: every score <= 0 and some
    below -1, outside the cosine range), for a re-ranker reading ``sims`` as similarities (``why`` says how its
    formula breaks). All-negative cosines (a model whose scores all lie in [-1, 0], e.g. CODER on synth) pass with
    a warning: the re-ranker then does what the reference code does with them, which inverts every ranking."""
    low, high = map(float, torch.aminmax(sims))
    if high <= 0.0 and low < -1.0:
        raise XmrError(f"re-ranker {name!r}: every similarity is <= 0, as in log-probabilities (PCME's "
                       f"log_match_prob); {why}. For log-probabilities pass scores=log_prob (PCME's config sets "
                       f"eval.rerank.{name}.scores: log_prob); see docs/evaluation.md")
    if high <= 0.0:  # allowed (the reference does it), but every ranking comes out inverted
        warnings.warn(f"re-ranker {name!r}: every similarity is <= 0 (cosines in [{low:.3g}, {high:.3g}]); {why}",
                      stacklevel=3)


def require_log_probabilities(sims: torch.Tensor, name: str) -> None:
    """Error unless every score is a log-probability (<= 0), for a re-ranker given ``scores=log_prob``."""
    top = float(sims.amax())
    if top > 0.0:
        raise XmrError(f"re-ranker {name!r}: scores=log_prob but the matrix has a score {top:g} > 0, so it is not "
                       "log-probabilities; use scores=similarity (e.g. for PCME with model.pcme_score match_prob)")


def prepare_rerank(sims, name: str, params: Mapping[str, Any] | None = None, captions_per_image: int | None = None,
                   dataset: str | None = None, context: RerankContext | None = None) -> tuple[Rescoring, dict]:
    """Lazy re-ranked scores of ``sims`` and the resolved parameters (what was actually used)."""
    spec = RERANKERS.get(name)
    resolved = resolve_params(name, params, dataset)
    if context is None:
        context = RerankContext(captions_per_image=captions_per_image)
    return spec.prepare(_as_matrix(sims), resolved, context), resolved


def rerank(sims, name: str, params: Mapping[str, Any] | None = None, captions_per_image: int | None = None,
           dataset: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-ranked ``(sims_i2t, sims_t2i)``: rank rows of the first for image->text, columns of the second for
    text->image. ``params`` override the defaults of ``dataset`` (see :func:`default_params`). Tensors, whatever
    ``sims`` is: the materialised matrices are for inspection and tests; the evaluator ranks in blocks instead."""
    rescoring, _ = prepare_rerank(sims, name, params, captions_per_image, dataset)
    return rescoring.materialize()
