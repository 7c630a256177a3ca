"""The hybrid Gaussian-Laplacian mixture of HGLMM (Klein et al., CVPR 2015): per component and dimension a Gaussian
or a Laplacian, whichever fits better, fitted with EM; the Fisher vector of a caption's words under it
(:mod:`xmr.text.hglmm` builds the caption features around it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xmr.core.errors import XmrError

#: how a Fisher vector is normalised (``fv_norm`` in config/text_features.yaml)
FV_NORMS = ("power_l2", "l2", "none")

_LOG_2PI = math.log(2 * math.pi)


@dataclass
class HybridMixture:
    """K components over D independent dimensions; per (k, d) a Gaussian (``gaussian[k, d]``) or a Laplacian.

    Arrays are float64 numpy: ``weights`` (K,), Gaussian ``mean``/``var`` (K, D), Laplacian ``loc``/``scale``
    (K, D), ``gaussian`` (K, D) bool.
    """

    weights: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    loc: np.ndarray
    scale: np.ndarray
    gaussian: np.ndarray

    @property
    def num_components(self) -> int:
        return len(self.weights)

    @property
    def dim(self) -> int:
        return self.mean.shape[1]

    @property
    def fv_dim(self) -> int:
        return 2 * self.num_components * self.dim

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        t = {k: torch.as_tensor(getattr(self, k), dtype=torch.float64, device=device)
             for k in ("weights", "mean", "var", "loc", "scale")}
        t["gaussian"] = torch.as_tensor(self.gaussian, dtype=torch.bool, device=device)
        return t

    @staticmethod
    def _log_joint(x: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """(n, K): log w_k + log p(x_i | k). The Gaussian dimensions are a quadratic form in x (two matrix
        products); only the Laplacian (k, d) pairs need elementwise |x_d - m_kd| terms."""
        g = t["gaussian"]
        a = torch.where(g, -0.5 / t["var"], 0.0)
        b = torch.where(g, t["mean"] / t["var"], 0.0)
        const = torch.where(g, -0.5 * (_LOG_2PI + torch.log(t["var"])) - t["mean"] ** 2 / (2 * t["var"]),
                            -torch.log(2 * t["scale"])).sum(1)
        out = (x * x) @ a.t() + x @ b.t() + (const + torch.log(t["weights"]))
        lk, ld = torch.nonzero(~g, as_tuple=True)
        if len(lk):
            out.index_add_(1, lk, -(x[:, ld] - t["loc"][lk, ld]).abs() / t["scale"][lk, ld])
        return out

    def log_joint(self, x: np.ndarray | torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
        dev = torch.device(device)
        return self._log_joint(torch.as_tensor(x, dtype=torch.float64, device=dev), self.tensors(dev))

    def responsibilities(self, x: np.ndarray | torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
        return torch.softmax(self.log_joint(x, device), dim=1)

    def fisher_vectors(self, words: np.ndarray | torch.Tensor, caption_of_word: np.ndarray | torch.Tensor,
                       num_captions: int, norm: str = "power_l2", device: str | torch.device = "cpu"
                       ) -> torch.Tensor:
        """(C, 2 K D) Fisher vectors of captions whose words are rows of ``words`` (W, D); ``caption_of_word``
        (W,) gives each word's caption in ``0 .. num_captions-1``. A caption without words gets zeros.

        Layout: [G_loc (K, D) row-major, G_scale (K, D) row-major], with the diagonal Fisher normalisation of
        card §10.5 (Gaussian: 1/sqrt(w), 1/sqrt(2w); Laplacian: 1/sqrt(w), 1/sqrt(w)) and a 1/n_words factor.
        """
        if norm not in FV_NORMS:
            raise XmrError(f"fv_norm: {norm!r} is not one of {', '.join(FV_NORMS)}")
        dev = torch.device(device)
        t = self.tensors(dev)
        x = torch.as_tensor(words, dtype=torch.float64, device=dev)
        cid = torch.as_tensor(caption_of_word, dtype=torch.long, device=dev)
        K, D = self.num_components, self.dim
        g_loc = torch.zeros(num_captions, K, D, dtype=torch.float64, device=dev)
        g_scale = torch.zeros_like(g_loc)
        if len(x):
            gamma = torch.softmax(self._log_joint(x, t), dim=1)  # (W, K)
            # Gaussian dimensions from the per-caption moments S0 = sum g, S1 = sum g x, S2 = sum g x^2
            s0 = torch.zeros(num_captions, K, 1, dtype=torch.float64, device=dev).index_add_(0, cid, gamma[:, :, None])
            s1 = torch.zeros_like(g_loc).index_add_(0, cid, gamma[:, :, None] * x[:, None, :])
            s2 = torch.zeros_like(g_loc).index_add_(0, cid, gamma[:, :, None] * (x * x)[:, None, :])
            mu, var = t["mean"], t["var"]
            g_loc = (s1 - mu * s0) / var.sqrt()
            g_scale = ((s2 - 2 * mu * s1 + mu ** 2 * s0) / var - s0) / math.sqrt(2)
            # Laplacian (k, d) pairs overwrite theirs: sign and scaled absolute deviation
            lk, ld = torch.nonzero(~t["gaussian"], as_tuple=True)
            if len(lk):
                z = x[:, ld] - t["loc"][lk, ld]
                wl = gamma[:, lk]
                zero = torch.zeros(num_captions, len(lk), dtype=torch.float64, device=dev)
                g_loc[:, lk, ld] = zero.index_add(0, cid, wl * torch.sign(z))
                g_scale[:, lk, ld] = zero.index_add(0, cid, wl * (z.abs() / t["scale"][lk, ld] - 1))
        n = torch.bincount(cid, minlength=num_captions).to(torch.float64).clamp(min=1)[:, None, None]
        inv_sqrt_w = t["weights"].rsqrt()[None, :, None]
        fv = torch.cat([(g_loc / n * inv_sqrt_w).flatten(1), (g_scale / n * inv_sqrt_w).flatten(1)], dim=1)
        if norm == "power_l2":
            fv = torch.sign(fv) * fv.abs().sqrt()
        if norm in ("power_l2", "l2"):
            fv = fv / fv.norm(dim=1, keepdim=True).clamp(min=1e-12)
        return fv

    @classmethod
    def fit(cls, x: np.ndarray, components: int, iterations: int = 100, tol: float = 1e-5, seed: int = 0,
            min_variance: float = 1e-3, min_scale: float = 1e-3, device: str | torch.device = "cpu",
            progress: bool = False) -> tuple["HybridMixture", dict[str, Any]]:
        """EM from a k-means start (card §10.4). M-step per (k, d): Gaussian ML mean/variance, Laplacian
        location = weighted median and scale = weighted mean absolute deviation, then keep whichever of the
        two has the larger weighted log-likelihood."""
        from sklearn.cluster import KMeans

        n, D = x.shape
        K = components
        if n < K:
            raise XmrError(f"hglmm: {n} fitting vectors for {K} components; lower `components` or give more data")
        dev = torch.device(device)
        km = KMeans(n_clusters=K, n_init=1, random_state=seed).fit(x)
        X = torch.as_tensor(x, dtype=torch.float64, device=dev)
        gamma = torch.zeros(n, K, dtype=torch.float64, device=dev)
        gamma[torch.arange(n), torch.as_tensor(km.labels_, device=dev)] = 1.0
        order = torch.argsort(X, dim=0)  # sorted once: weighted medians are cumsums in this order
        X_sorted = torch.gather(X, 0, order)
        chunk = max(1, (1 << 23) // max(1, K * D))
        mix, history = None, []
        for it in range(iterations + 1):
            mix = cls._m_step(X, X_sorted, order, gamma, min_variance, min_scale)
            if it == iterations:
                break
            t = mix.tensors(dev)
            ll_sum = 0.0
            for s in range(0, n, chunk):  # E-step in chunks: (chunk, K, D) temporaries
                lj = cls._log_joint(X[s:s + chunk], t)
                lse = torch.logsumexp(lj, dim=1, keepdim=True)
                gamma[s:s + chunk] = torch.exp(lj - lse)
                ll_sum += float(lse.sum())
            history.append(ll_sum / n)
            if progress:
                print(f"hglmm EM iteration {it + 1}: mean log-likelihood {history[-1]:.5f}")
            if len(history) > 1 and abs(history[-1] - history[-2]) <= tol * abs(history[-2]):
                mix = cls._m_step(X, X_sorted, order, gamma, min_variance, min_scale)
                break
        info = {"em_iterations": len(history), "mean_log_likelihood": history[-1] if history else None,
                "fit_vectors": n, "gaussian_fraction": float(mix.gaussian.mean())}
        return mix, info

    @classmethod
    def _m_step(cls, X, X_sorted, order, gamma, min_variance, min_scale) -> "HybridMixture":
        n, D = X.shape
        K = gamma.shape[1]
        nk = gamma.sum(0).clamp(min=1e-10 * n)
        weights = nk / nk.sum()
        mean = gamma.t() @ X / nk[:, None]
        s2 = (gamma.t() @ (X * X) / nk[:, None] - mean ** 2).clamp(min=0)
        var = s2.clamp(min=min_variance)
        loc = torch.empty(K, D, dtype=X.dtype, device=X.device)
        s1 = torch.empty(K, D, dtype=X.dtype, device=X.device)
        for k in range(K):
            g = gamma[:, k]
            cs = torch.cumsum(g[order], dim=0)  # (n, D): weights accumulated in each dimension's sorted order
            first = torch.searchsorted(cs.t().contiguous(), (0.5 * nk[k]).expand(D, 1).contiguous()).squeeze(1)
            loc[k] = X_sorted[first.clamp(max=n - 1), torch.arange(D, device=X.device)]
            s1[k] = g @ (X - loc[k]).abs() / nk[k]
        scale = s1.clamp(min=min_scale)
        ll_gauss = -0.5 * (_LOG_2PI + torch.log(var)) - s2 / (2 * var)
        ll_lap = -torch.log(2 * scale) - s1 / scale
        gaussian = ll_gauss >= ll_lap
        return cls(*(a.cpu().numpy() for a in (weights, mean, var, loc, scale, gaussian)))
