"""DVSE Fig. 6: the correlation matrix of an image's K sub-embeddings, from a trained set-based run.

Works for any run whose model returns image sets (B, K, D) (dvse, pvse, dive). ``kind`` picks the vectors:
``embeddings`` (what retrieval uses, v^k) or ``residuals`` (DVSE/PVSE's attention residuals v̂^k, on which the
orthogonal constraint acts; DivE's slots before the global feature is added).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from xmr.core.errors import XmrError

KINDS = ("embeddings", "residuals")


def _set_vectors(model, feats: torch.Tensor, num_regions: torch.Tensor, kind: str) -> torch.Tensor:
    out = model.image_outputs(feats, num_regions)
    emb = out["img"]
    if emb.ndim != 3:
        raise XmrError(f"method {model.method_name!r} gives one image embedding, not a set of sub-embeddings; "
                       f"the correlation matrix needs a set-based run (dvse, pvse, dive)")
    if kind == "embeddings":
        return emb
    vecs = out.get("image_residuals", out.get("image_slots"))
    if vecs is None:
        raise XmrError(f"method {model.method_name!r} has no sub-embedding residuals; use kind embeddings")
    return vecs


@torch.no_grad()
def subembedding_correlation(run_dir: str | os.PathLike, split: str | None = None, kind: str = "embeddings",
                             measure: str = "cosine", absolute: bool = False, max_images: int | None = None,
                             device: str = "auto") -> np.ndarray:
    """(K, K) symmetric matrix with unit diagonal: the correlation of sub-embeddings k and l, averaged over the
    images of ``split`` (default: the test split).

    ``measure``: ``cosine`` (the correlation L_dc penalises) or ``pearson`` (vectors centred over their D
    dimensions first). ``absolute``: average |correlation| instead.
    """
    from torch.utils.data import DataLoader

    from xmr.evaluation.set_stats import correlation_sums
    from xmr.inference.loaders import image_input, image_loader_parts, load_split_images
    from xmr.inference.model import load_trained
    from xmr.settings.run_settings import run_settings
    from xmr.core.utils import resolve_device

    if kind not in KINDS:
        raise XmrError(f"kind {kind!r}: choose one of {', '.join(KINDS)}")
    dev = resolve_device(device)
    model, cfg = load_trained(run_dir, dev)
    split = split or cfg["dataset_cfg"]["test_split"]
    settings = run_settings(cfg)
    data, images = load_split_images(settings.image, settings.dataset_config, split)  # features, or image files
    n = data.num_images if max_images is None else min(max_images, data.num_images)
    dataset, collate = image_loader_parts(images, list(range(n)), cfg["features"]["max_regions"])
    loader = DataLoader(dataset, batch_size=cfg["eval"]["batch_size"], collate_fn=collate)
    total, count = None, 0
    for b in loader:
        feats, nr = model.image_local_features(*image_input(b, dev))
        x = _set_vectors(model, feats, nr, kind)
        corr = correlation_sums(x, measure, absolute)  # the library's measure (xmr/evaluation/set_stats.py)
        total = corr if total is None else total + corr
        count += x.shape[0]
    if not count:
        raise XmrError(f"split {split!r} of {cfg['dataset']} has no images")
    return (total / count).cpu().numpy()


def plot_subembedding_correlation(matrix: np.ndarray, out_png: str | os.PathLike, title: str | None = None) -> None:
    """Heat map of a (K, K) correlation matrix (values written in the cells), saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xmr.core.io import atomic_path

    m = np.asarray(matrix, dtype=float)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise XmrError(f"correlation matrix must be square (K, K), got shape {m.shape}")
    k = m.shape[0]
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * k, 0.8 + 0.6 * k))
    im = ax.imshow(m, vmin=-1.0 if m.min() < 0 else 0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(k), [str(i + 1) for i in range(k)])
    ax.set_yticks(range(k), [str(i + 1) for i in range(k)])
    ax.set_xlabel("sub-embedding")
    ax.set_ylabel("sub-embedding")
    if k <= 12:
        for i in range(k):
            for j in range(k):
                ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="black" if m[i, j] > 0.6 else "white")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    with atomic_path(out_png, ".png") as tmp:
        fig.savefig(tmp, dpi=150, format="png")
    plt.close(fig)


__all__ = ["subembedding_correlation", "plot_subembedding_correlation"]
