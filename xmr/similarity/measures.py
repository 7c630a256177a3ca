"""Image-caption similarity for single embeddings and embedding sets, in bounded-memory blocks.

Rows are images, columns are captions. ``images`` is (N, D) or (N, K, D), ``captions`` is (M, D) or (M, L, D);
a 2-D input is a set of size one, so DVSE's K image sub-embeddings against one caption embedding is simply
(N, K, D) vs (M, D). Every set measure reduces the element similarity matrix c(x, y) of one image set X and one
caption set Y (|X| = K, |Y| = L):

- ``cosine``         c(x, y) for single vectors (K = L = 1)
- ``max``            max_{x,y} c(x, y)                                   (PVSE's MIL similarity)
- ``mean``           mean_{x,y} c(x, y)                                  (= <mean x, mean y>; PCME's "sum" / K·L)
- ``chamfer``        1/(2K) Σ_x max_y c + 1/(2L) Σ_y max_x c              (DivE §3.3)
- ``smooth_chamfer`` 1/(2αK) Σ_x LSE_y(α c) + 1/(2αL) Σ_y LSE_x(α c)      (DivE Eq. 6-7, α = 16)
- ``match_prob``     mean_{x,y} σ(-a‖x - y‖ + b), σ(z) = e^z / (e^z + e^-z)    (PCME match probability, J×J)
- ``log_match_prob`` log ``match_prob`` = LSE_{x,y} log σ(-a‖x - y‖ + b) - log(K·L), in log space: the same
                     ranking, without float32 underflow (``match_prob`` is exactly 0 for a pair whose logits
                     b - a‖x - y‖ are all below about -44, so far pairs tie at 0; here they stay ordered)

c is the cosine: elements are L2-normalised first (``normalize=True``, the default for every measure except
``match_prob``/``log_match_prob``, whose distances are between PCME's raw samples). :func:`compute_similarity`
evaluates whole test sets in float32 blocks (no (N·K)×(M·L) temporary, the cause of OOM at COCO-5K with sets) and
:func:`set_similarity` is the same formula for a training batch, differentiable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.lazy import is_tensor, torch  # NumPy inputs on the CPU never import torch (docs/speed.md)
from xmr.core.registry import Registry

Reduce = Callable[..., "torch.Tensor"]

# Element-similarity blocks (n, K, m, L) are kept under this many bytes (times a small factor for temporaries).
DEFAULT_BLOCK_BYTES = 128 * 2**20


@dataclass(frozen=True)
class SetMeasure:
    """How one measure turns element similarities ``dots`` (n, K, m, L) into set similarities (n, m)."""

    name: str
    reduce: Reduce  # reduce(dots, sq_x (n,K), sq_y (m,L), **params) -> (n, m)
    normalize: bool  # default for ``normalize``: compare unit vectors (cosine)
    temporaries: int = 1  # extra block-sized temporaries the reduction allocates (for block sizing)
    needs_norms: bool = False
    # reduce_np(dots (n, K, m, L), out (n, m)): the same reduction of NumPy blocks, written into ``out``; a measure
    # without one computes NumPy inputs with torch
    reduce_np: Callable[[np.ndarray, np.ndarray], Any] | None = None


SIMILARITIES: Registry[SetMeasure] = Registry("similarity measure")


def _register(m: SetMeasure) -> SetMeasure:
    return SIMILARITIES.register(m.name)(m)


def _cosine(dots, sq_x, sq_y):
    if dots.shape[1] != 1 or dots.shape[3] != 1:
        raise XmrError(f"measure 'cosine' compares single vectors, got sets of {dots.shape[1]} image and "
                       f"{dots.shape[3]} caption embeddings; use one of: max, mean, chamfer, smooth_chamfer, "
                       "match_prob, log_match_prob")
    return dots[:, 0, :, 0]


def _max(dots, sq_x, sq_y):
    return dots.amax(dim=(1, 3))


def _mean(dots, sq_x, sq_y):
    return dots.mean(dim=(1, 3))


def _chamfer(dots, sq_x, sq_y):
    # each image element matched to its closest caption element, and vice versa
    return 0.5 * dots.amax(dim=3).mean(dim=1) + 0.5 * dots.amax(dim=1).mean(dim=2)


def _smooth_chamfer(dots, sq_x, sq_y, alpha: float = 16.0):
    if not alpha > 0:
        raise XmrError(f"smooth_chamfer needs alpha > 0, got {alpha}")
    a = dots * alpha
    # logsumexp is the numerically stable form of DivE's log(sum(exp(.))) pooling
    x_side = torch.logsumexp(a, dim=3).mean(dim=1)  # (n, m): Σ_x LSE_y / K
    y_side = torch.logsumexp(a, dim=1).mean(dim=2)  # (n, m): Σ_y LSE_x / L
    return (x_side + y_side) / (2.0 * alpha)


def _match_logits(dots, sq_x, sq_y, a: float, b: float) -> torch.Tensor:
    """2(b - a‖x - y‖) per element pair (n, K, m, L): the logistic argument of PCME's σ(b - a‖x - y‖).

    PCME's σ(z) = e^z / (e^z + e^-z) = logistic(2z), so its learned (a, b) plug in unchanged. Without autograd
    (:func:`compute_similarity`) this overwrites ``dots`` in place and allocates no block-sized temporary.
    """
    if torch.is_grad_enabled():
        # ‖x - y‖² = ‖x‖² + ‖y‖² - 2<x, y>; clamp the rounding error below zero before the sqrt
        d2 = sq_x[:, :, None, None] + sq_y[None, None, :, :] - 2.0 * dots
        return 2.0 * (b - a * d2.clamp_min(0.0).sqrt())
    z = dots.mul_(-2.0).add_(sq_x[:, :, None, None]).add_(sq_y[None, None, :, :])
    return z.clamp_min_(0.0).sqrt_().mul_(-2.0 * a).add_(2.0 * b)


def _match_prob(dots, sq_x, sq_y, a: float = 5.0, b: float = 5.0):
    z = _match_logits(dots, sq_x, sq_y, a, b)
    return (z.sigmoid_() if not torch.is_grad_enabled() else torch.sigmoid(z)).mean(dim=(1, 3))


def _log_match_prob(dots, sq_x, sq_y, a: float = 5.0, b: float = 5.0):
    # log mean_s σ(z_s) = LSE_s log σ(z_s) - log S, with log σ(z) exact where σ(z) underflows (≈ z for z ≪ 0)
    z = _match_logits(dots, sq_x, sq_y, a, b)
    s = dots.shape[1] * dots.shape[3]
    if torch.is_grad_enabled():
        return torch.logsumexp(torch.nn.functional.logsigmoid(z), dim=(1, 3)) - math.log(s)
    # in place but for one block (logsigmoid would allocate two on CPU): log σ(z) = min(z, 0) - log(1 + e^-|z|)
    log_p = z.clamp_max(0.0)
    log_p.sub_(z.abs_().neg_().exp_().log1p_())
    top = log_p.amax(dim=(1, 3), keepdim=True)  # finite: log σ(z) >= z - log 2, and z is finite
    total = log_p.sub_(top).exp_().sum(dim=(1, 3))  # in [1, S]: the largest term is exp(0)
    return total.log_() + top[:, 0, :, 0] - math.log(s)


def _cosine_np(dots: np.ndarray, out: np.ndarray) -> None:
    out[...] = dots[:, 0, :, 0]  # single vectors: compute_similarity has checked K = L = 1


def _max_np(dots: np.ndarray, out: np.ndarray) -> None:
    np.max(dots, axis=(1, 3), out=out)


def _mean_np(dots: np.ndarray, out: np.ndarray) -> None:
    np.mean(dots, axis=(1, 3), out=out)


_register(SetMeasure("cosine", _cosine, normalize=True, temporaries=0, reduce_np=_cosine_np))
_register(SetMeasure("max", _max, normalize=True, temporaries=0, reduce_np=_max_np))
_register(SetMeasure("mean", _mean, normalize=True, temporaries=0, reduce_np=_mean_np))
_register(SetMeasure("chamfer", _chamfer, normalize=True, temporaries=1))
_register(SetMeasure("smooth_chamfer", _smooth_chamfer, normalize=True, temporaries=3))
# match_prob works in place on the element block; log_match_prob adds one block for log σ
_register(SetMeasure("match_prob", _match_prob, normalize=False, temporaries=0, needs_norms=True))
_register(SetMeasure("log_match_prob", _log_match_prob, normalize=False, temporaries=1, needs_norms=True))

MATCH_MEASURES = ("match_prob", "log_match_prob")


def _measure_params(measure: str, alpha: float, params: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the measure's reduce function; unknown names are an error."""
    allowed = {"smooth_chamfer": {"alpha"}, **{name: {"a", "b"} for name in MATCH_MEASURES}}.get(measure, set())
    unknown = set(params) - allowed
    if unknown:
        raise XmrError(f"measure {measure!r} has no parameter(s) {', '.join(sorted(unknown))}"
                       + (f"; it takes: {', '.join(sorted(allowed))}" if allowed else "; it takes none"))
    out = dict(params)
    if measure == "smooth_chamfer":
        out.setdefault("alpha", alpha)
    return out


def _as_sets(x, what: str):
    """numpy/torch (B, D) or (B, S, D) -> floating (B, S, D) of the same kind (a view when possible)."""
    if is_tensor(x):
        if x.is_complex():
            raise XmrError(f"{what} hold complex numbers ({x.dtype}); give real values")
    else:
        x = np.asarray(x)
        if x.dtype.kind not in "biuf":  # strings, objects, complex: never silently cast
            raise XmrError(f"{what} have dtype {x.dtype}; expected real numbers (float or int)")
    if x.ndim == 2:
        x = x[:, None, :]
    if x.ndim != 3:
        raise XmrError(f"{what} must be (n, D) or (n, set size, D), got shape {tuple(x.shape)}")
    if is_tensor(x):
        return x if x.is_floating_point() else x.float()
    return x if x.dtype.kind == "f" else x.astype(np.float32)


def all_finite(t) -> bool:
    """True when ``t`` (tensor or NumPy array) has no NaN/inf. The minimum and maximum propagate NaN and expose
    inf, and unlike ``isfinite(t).all()`` they allocate nothing (about 20x faster on a COCO-5K matrix); torch's
    ``aminmax`` reads the tensor once for both."""
    if not is_tensor(t):
        a = np.asarray(t)
        return a.size == 0 or bool(np.isfinite(a.min()) and np.isfinite(a.max()))
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(high)) and bool(torch.isfinite(low))


def _nonfinite_count(t) -> int:
    return int((~torch.isfinite(t)).sum()) if is_tensor(t) else int((~np.isfinite(t)).sum())


def _check_finite(t, what: str) -> None:
    if not all_finite(t):
        raise XmrError(f"{what} contain {_nonfinite_count(t)} NaN or inf value(s)")


def set_similarity(images: torch.Tensor, captions: torch.Tensor, measure: str = "max", alpha: float = 16.0,
                   normalize: bool | None = None, **params: float) -> torch.Tensor:
    """Differentiable (B, B') similarities of a batch: images (B, K, D) or (B, D), captions (B', L, D) or (B', D).

    Same formulas as :func:`compute_similarity` (which calls this per block); use it inside training losses.
    ``params``: ``a``, ``b`` for ``match_prob``/``log_match_prob`` (PCME's negative scale and shift, default 5, 5).
    """
    spec = SIMILARITIES.get(measure)
    x, y = torch.as_tensor(_as_sets(images, "images")), torch.as_tensor(_as_sets(captions, "captions"))
    if x.shape[-1] != y.shape[-1]:
        raise XmrError(f"embedding sizes differ: images have D={x.shape[-1]}, captions D={y.shape[-1]}")
    kw = _measure_params(measure, alpha, params)
    if spec.normalize if normalize is None else normalize:
        x, y = _normalized(x), _normalized(y)
    return _block(spec, x, y, kw)


def _block(spec: SetMeasure, x: torch.Tensor, y: torch.Tensor, kw: dict,
           buffer: torch.Tensor | None = None) -> torch.Tensor:
    """Set similarities of an image block x (n, K, D) and a caption block y (m, L, D) -> (n, m).

    ``buffer`` (no autograd): flat float32 storage of at least n·K·m·L elements that receives the element
    similarities, so that a loop over blocks reuses one allocation instead of faulting in fresh pages per block."""
    n, k, d = x.shape
    m, l, _ = y.shape
    if spec.name == "mean":
        # mean of all pairwise dot products == dot product of the set means: an (n, D) x (D, m) matmul only
        return x.mean(dim=1) @ y.mean(dim=1).T
    if buffer is None:
        dots = (x.reshape(n * k, d) @ y.reshape(m * l, d).T).view(n, k, m, l)
    elif buffer.device.type == "cpu":
        # NumPy's BLAS for the block GEMM on the CPU: OpenBLAS picks its kernels for the CPU it finds, while
        # torch's MKL runs AVX2 code on AMD CPUs (a COCO-5K DVSE evaluation: 7.5 s vs 8.5 s of GEMM on an
        # AVX-512 EPYC); the same library as the NumPy baseline of docs/speed.md on any vendor
        flat = buffer[:n * k * m * l].view(n * k, m * l)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported once, by compute_similarity
            np.matmul(x.detach().reshape(n * k, d).numpy(), y.detach().reshape(m * l, d).numpy().T,
                      out=flat.numpy())
        dots = flat.view(n, k, m, l)
    else:
        dots = torch.mm(x.reshape(n * k, d), y.reshape(m * l, d).T,
                        out=buffer[:n * k * m * l].view(n * k, m * l)).view(n, k, m, l)
    sq_x = sq_y = None
    if spec.needs_norms:
        sq_x, sq_y = (x * x).sum(-1), (y * y).sum(-1)
    return spec.reduce(dots, sq_x, sq_y, **kw)


def _normalized(t):
    """Unit vectors along the last axis (a zero vector stays zero): torch's ``F.normalize`` formula, x / max(‖x‖,
    1e-12). NumPy's norm rounds differently from torch's: the two paths agree to float32 rounding, not bit for
    bit."""
    if is_tensor(t):
        return torch.nn.functional.normalize(t, dim=-1)
    with np.errstate(over="ignore"):  # a norm past float32's range is inf, as in torch: the vector becomes zero
        return t / np.maximum(np.linalg.norm(t, axis=-1, keepdims=True), np.float32(1e-12))


def _unit_or_normalized(t):
    """``t`` itself when it is already unit-norm (saves a copy of a large gallery), else a normalised copy."""
    with np.errstate(over="ignore"):
        norms = t.norm(dim=-1) if is_tensor(t) else np.linalg.norm(t, axis=-1)
    if bool((abs(norms - 1.0) < 1e-4).all()):
        return t
    return _normalized(t)


def compute_similarity(images, captions, measure: str = "cosine", alpha: float = 16.0, chunk_size: int | None = None,
                       device: str | torch.device | None = None, normalize: bool | None = None,
                       block_bytes: int = DEFAULT_BLOCK_BYTES, **params: float):
    """(N, M) float32 similarity matrix of N images and M captions (numpy or torch, 2-D or 3-D inputs).

    NumPy in, NumPy out: when neither input is a tensor and ``device`` is unset or ``"cpu"``, the result is a
    NumPy array, computed without importing torch for the measures that have a NumPy form (cosine, max, mean);
    otherwise it is a tensor on ``device`` (default: the device of ``images`` if it is a tensor, else CPU).
    ``chunk_size``: images per block (default: as many as fit in ``block_bytes`` of element similarities; the
    captions are split too when one image's row of elements alone would not fit). ``alpha``: the smooth-Chamfer
    temperature; ``params``: ``a``, ``b`` for ``match_prob``/``log_match_prob``.
    """
    spec = SIMILARITIES.get(measure)
    kw = _measure_params(measure, alpha, params)
    x_all, y_all = _as_sets(images, "images"), _as_sets(captions, "captions")
    if x_all.shape[-1] != y_all.shape[-1]:
        raise XmrError(f"embedding sizes differ: images have D={x_all.shape[-1]}, captions D={y_all.shape[-1]}")
    _check_finite(x_all, "image embeddings")
    _check_finite(y_all, "caption embeddings")
    n, k, d = x_all.shape
    m, l, _ = y_all.shape
    if measure == "cosine" and (k != 1 or l != 1):
        _cosine(np.empty((1, k, 1, l)), None, None)  # raises the explanatory error
    if chunk_size is not None and chunk_size < 1:
        raise XmrError(f"chunk_size must be >= 1, got {chunk_size}")
    do_norm = spec.normalize if normalize is None else normalize
    numpy_out = not (is_tensor(x_all) or is_tensor(y_all)) and (device is None or str(device) == "cpu")
    if numpy_out and spec.reduce_np is not None:
        out = _similarity_numpy(spec, x_all, y_all, do_norm, chunk_size, block_bytes)
    else:
        if device is None:
            device = x_all.device if is_tensor(x_all) else "cpu"
        with torch.no_grad():
            out = _similarity_torch(spec, kw, torch.as_tensor(x_all), torch.as_tensor(y_all), torch.device(device),
                                    do_norm, chunk_size, block_bytes)
    # unit vectors bound every measure; without normalisation float32 can overflow (values near 1e20)
    if not do_norm and not all_finite(out):
        raise XmrError(f"measure {measure!r}: {_nonfinite_count(out)} similarities overflowed to NaN or inf in "
                       f"float32 (largest embedding magnitude {max(_absmax(x_all), _absmax(y_all)):.3g}); "
                       "rescale the embeddings")
    return out.numpy() if numpy_out and is_tensor(out) else out


def _block_plan(spec: SetMeasure, n: int, m: int, k: int, l: int, chunk_size: int | None,
                block_bytes: int) -> tuple[int, int, int, int]:
    """(images per block, captions per block, K, L) of the element blocks, the set means for ``mean``."""
    k_eff, l_eff = (1, 1) if spec.name == "mean" else (k, l)
    per_pair = k_eff * l_eff * 4 * (1 + spec.temporaries)  # bytes of block temporaries per (image, caption)
    caps_per_block = max(1, min(m, block_bytes // max(1, per_pair)))
    if chunk_size is None:
        chunk_size = max(1, block_bytes // (per_pair * caps_per_block))
    return max(1, min(chunk_size, n)), caps_per_block, k_eff, l_eff


def _similarity_numpy(spec: SetMeasure, x_all: np.ndarray, y_all: np.ndarray, do_norm: bool,
                      chunk_size: int | None, block_bytes: int) -> np.ndarray:
    """The CPU computation on NumPy arrays: the blocks' GEMMs run in NumPy's BLAS (see ``_block``), and each
    block's reduction writes straight into the result."""
    n, k, d = x_all.shape
    m, l, _ = y_all.shape
    rows, caps, k_eff, l_eff = _block_plan(spec, n, m, k, l, chunk_size, block_bytes)
    y_all = y_all.astype(np.float32, copy=False)
    if do_norm:
        y_all = _unit_or_normalized(y_all)
    if spec.name == "mean":
        y_all = y_all.mean(axis=1, keepdims=True)
    out = np.empty((n, m), np.float32)
    buffer = np.empty(rows * k_eff * caps * l_eff, np.float32)  # one element block, reused (see _similarity_torch)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported once, by compute_similarity
        for r0 in range(0, n, rows):
            x = x_all[r0:r0 + rows].astype(np.float32, copy=False)
            if do_norm:
                x = _normalized(x)
            if spec.name == "mean":
                x = x.mean(axis=1, keepdims=True)
            nb = x.shape[0]
            for c0 in range(0, m, caps):
                y = y_all[c0:c0 + caps]
                mb = y.shape[0]
                dots = buffer[:nb * k_eff * mb * l_eff].reshape(nb * k_eff, mb * l_eff)
                np.matmul(x.reshape(nb * k_eff, d), y.reshape(mb * l_eff, d).T, out=dots)
                spec.reduce_np(dots.reshape(nb, k_eff, mb, l_eff), out[r0:r0 + nb, c0:c0 + mb])
    return out


def _similarity_torch(spec: SetMeasure, kw: dict, x_all: torch.Tensor, y_all: torch.Tensor, device: torch.device,
                      do_norm: bool, chunk_size: int | None, block_bytes: int) -> torch.Tensor:
    n, k, d = x_all.shape
    m, l, _ = y_all.shape
    rows, caps, k_eff, l_eff = _block_plan(spec, n, m, k, l, chunk_size, block_bytes)
    y_all = y_all.to(device=device, dtype=torch.float32)
    if do_norm:
        y_all = _unit_or_normalized(y_all)
    if spec.name == "mean":
        # the set-mean shortcut needs only (N, D) and (M, D) means; one matmul in blocks of images
        y_all = y_all.mean(dim=1, keepdim=True)
    out = torch.empty(n, m, dtype=torch.float32, device=device)
    # one element-similarity block, reused: a fresh block per step would fault in its pages every time (on CPU
    # about 2 us of kernel time per 4 KiB page: 1.4 s of a COCO-5K DVSE evaluation)
    buffer = None if spec.name == "mean" else torch.empty(rows * k_eff * caps * l_eff, dtype=torch.float32,
                                                          device=device)
    for r0 in range(0, n, rows):
        x = x_all[r0:r0 + rows].to(device=device, dtype=torch.float32)
        if do_norm:
            x = _normalized(x)
        if spec.name == "mean":
            x = x.mean(dim=1, keepdim=True)
        for c0 in range(0, m, caps):
            y = y_all[c0:c0 + caps]
            out[r0:r0 + x.shape[0], c0:c0 + y.shape[0]] = _block(spec, x, y, kw, buffer)
    return out


def _absmax(t) -> float:
    if is_tensor(t):
        return float(t.abs().amax()) if t.numel() else 0.0
    return float(np.abs(t).max()) if t.size else 0.0


def set_elements_kept(size: int, keep: list[int] | None = None, drop: list[int] | None = None,
                      what: str = "image") -> list[int] | None:
    """The element indices (0-based) of a K-element set that an ablated evaluation keeps (DivE Table 5: "only
    S^V(i)" is ``keep=[i-1]``, "all but S^V(2)" is ``drop=[1]``); None when both are empty (keep the whole set)."""
    if keep and drop:
        raise XmrError(f"{what} elements: give the elements to keep or the ones to drop, not both")
    given = keep or drop
    if not given:
        return None
    bad = [i for i in given if not 0 <= i < size]
    if bad or len(set(given)) != len(given):
        raise XmrError(f"{what} elements {given}: give distinct 0-based indices of the {size} set elements "
                       f"(0 to {size - 1})")
    kept = sorted(given) if keep else [i for i in range(size) if i not in set(given)]
    if not kept:
        raise XmrError(f"{what} elements: dropping all {size} elements leaves nothing to score; keep at least one")
    return kept


def select_set_elements(x, keep: list[int] | None = None, drop: list[int] | None = None, what: str = "image"):
    """``x`` (N, K, D) with only the kept elements of each set along K (see :func:`set_elements_kept`); ``x``
    itself when nothing is dropped. A NumPy array or tensor in, the same kind out."""
    if not keep and not drop:
        return x
    if len(x.shape) != 3:
        raise XmrError(f"{what} elements: the {what} embeddings are single vectors {tuple(x.shape)}, not sets "
                       f"(N, K, D); dropping set elements needs a set method's embeddings")
    kept = set_elements_kept(int(x.shape[1]), keep, drop, what)
    return x[:, kept]


def similarity_to_numpy(sims) -> np.ndarray:
    """CPU float32 numpy array of a similarity matrix, tensor or array (for saving)."""
    if is_tensor(sims):
        return sims.detach().to("cpu", torch.float32).numpy()
    return np.asarray(sims, dtype=np.float32)


__all__ = ["SIMILARITIES", "MATCH_MEASURES", "SetMeasure", "all_finite", "compute_similarity", "select_set_elements",
           "set_elements_kept", "set_similarity", "similarity_to_numpy", "DEFAULT_BLOCK_BYTES"]
