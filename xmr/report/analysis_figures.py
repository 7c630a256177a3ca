"""Analysis figures of the seed papers, drawn from run directories (``xmr figure ...``):

- ``tsne_figure``: t-SNE of a run's image and caption embeddings, every set element a point, coloured by its slot
  and shaped by its modality (DivE Fig. A1; CODER Fig. 3 for single-vector runs: coloured by modality). One panel
  per run, so runs trained differently sit side by side.
- ``compare_figure``: the same queries answered by two runs, side by side, text to image (DVSE Fig. 11) or image to
  text (DVSE Fig. 12; CODER Fig. 4 shows both), preferring queries where the two runs' first answers differ.
- ``curves_figure``: any column of ``history.csv`` per epoch, one line per run: VSE+2AD Fig. C-2 (ADOPT's K over
  training, column ``train_k``) and Fig. A.2-1 (validation RSUM with and without ADOPT, column ``val_rsum``).

The attention and region maps (DVSE Fig. 10, DivE Fig. 4, A2, A3) are :func:`xmr.report.figures.attention_figure`.
Every figure's footer names the machine that drew it (:func:`xmr.report.figures.produced_on`).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.io import load_array
from xmr.report.figures import _frame, _load_image, _plt, _save, pick_queries, produced_on, rank_order

SLOT_COLOURS = "tab10"


def _footer(fig, machine: str | None) -> None:
    fig.text(0.99, 0.005, produced_on(machine), fontsize=6, color="grey", ha="right", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))


def _gallery(run_dir: str | os.PathLike, split: str | None, device: str) -> dict[str, Any]:
    from xmr.inference.model import load

    model = load(run_dir, device)
    return {**model.encode_split(split), "name": model.cfg["name"], "dataset": model.cfg["dataset"]}


# -- t-SNE ------------------------------------------------------------------------------------------------------

def tsne_points(image_emb: np.ndarray, text_emb: np.ndarray, caption_image: list[int], images: list[int],
                seed: int = 0, perplexity: float = 30.0, all_captions: bool = False) -> dict[str, np.ndarray]:
    """2-D t-SNE of the set elements of ``images`` and of their first caption (every caption with
    ``all_captions``): ``xy`` (P, 2), ``modality`` (P,) 0 = image, 1 = caption, ``slot`` (P,) the element's index in
    its set (0 for single vectors), ``owner`` (P,) the image each point belongs to. Elements are L2-normalised first
    (the embeddings' cosine geometry)."""
    from sklearn.manifold import TSNE

    captions: dict[int, list[int]] = {}
    for j, i in enumerate(caption_image):
        captions.setdefault(int(i), []).append(j)
    missing = [i for i in images if i not in captions]
    if missing:
        raise XmrError(f"t-SNE: image {missing[0]} has no caption in the split")
    cap_rows = [j for i in images for j in (captions[i] if all_captions else captions[i][:1])]
    parts, modality, slot, owner = [], [], [], []
    for kind, emb, rows in ((0, image_emb, images), (1, text_emb, cap_rows)):
        x = np.asarray(emb, dtype=np.float64)[rows]
        if x.ndim == 2:
            x = x[:, None, :]
        n, k, _ = x.shape
        parts.append(x.reshape(n * k, -1))
        modality += [kind] * (n * k)
        slot += list(range(k)) * n
        owner += [int(caption_image[j]) if kind else j for j in rows for _ in range(k)]
    x = np.concatenate(parts)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    xy = TSNE(n_components=2, perplexity=min(perplexity, (len(x) - 1) / 3), init="pca", random_state=seed
              ).fit_transform(x)
    return {"xy": xy, "modality": np.array(modality), "slot": np.array(slot), "owner": np.array(owner)}


def tsne_figure(run_dirs: list[str | os.PathLike], out_png: str | os.PathLike, images: int = 100, seed: int = 0,
                split: str | None = None, device: str = "cpu", machine: str | None = None,
                all_captions: bool = False, element: int | None = None) -> dict[str, Any]:
    """One t-SNE panel per run (the same test images in each): o = image elements, ^ = caption elements; colour =
    slot for set methods, modality for single vectors. ``all_captions``: every caption of the images (CODER Fig. 3
    shows 1,000 images and their 5,000 captions), else the first; ``element``: only that element of each set
    (CODER's [instance, concept] pair: 0 = the instance embeddings)."""
    from xmr.similarity.measures import select_set_elements

    plt = _plt()
    fig, axes = plt.subplots(1, len(run_dirs), figsize=(max(6.0, 4.6 * len(run_dirs)), 4.8), squeeze=False)
    info = {}
    cmap = plt.get_cmap(SLOT_COLOURS)
    for ax, run in zip(axes[0], run_dirs):
        g = _gallery(run, split, device)
        picks = pick_queries(len(g["image_emb"]), images, seed)
        keep = None if element is None else [element]
        img_emb = select_set_elements(g["image_emb"], keep, what="image")
        txt_emb = select_set_elements(g["text_emb"], keep, what="caption")
        pts = tsne_points(img_emb, txt_emb, g["caption_image"], picks, seed, all_captions=all_captions)
        sets = int(pts["slot"].max()) + 1 > 1
        for kind, marker, label in ((0, "o", "image"), (1, "^", "caption")):
            on = pts["modality"] == kind
            colour = [cmap(s % 10) for s in pts["slot"][on]] if sets else [cmap(kind)] * int(on.sum())
            ax.scatter(pts["xy"][on, 0], pts["xy"][on, 1], s=9, marker=marker, color=colour, alpha=0.75,
                       linewidths=0, label=label)
        if sets:
            for s in range(int(pts["slot"].max()) + 1):
                ax.scatter([], [], s=20, color=cmap(s % 10), label=f"slot {s + 1}")
        ax.legend(fontsize=7, loc="best", markerscale=1.5)
        ax.set_title(f"{g['name']} ({g['dataset']} {g['split']})", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
        info[str(run)] = {"points": int(len(pts["xy"])), "images": len(picks), "slots": int(pts["slot"].max()) + 1}
    fig.suptitle(f"t-SNE of the embedding space: {images} test images, "
                 + ("all their captions" if all_captions else "one caption each")
                 + ("" if element is None else f", set element {element}"), fontsize=10)
    _footer(fig, machine)
    _save(fig, out_png)
    return info


# -- two runs side by side --------------------------------------------------------------------------------------

def disagreeing_queries(sims_a: np.ndarray, sims_b: np.ndarray, k: int, seed: int) -> list[int]:
    """Up to ``k`` query rows whose best answer differs between the two matrices (drawn with ``seed``), topped up
    with other rows when fewer differ."""
    differ = np.flatnonzero(sims_a.argmax(axis=1) != sims_b.argmax(axis=1))
    same = np.setdiff1d(np.arange(len(sims_a)), differ)
    rng = np.random.default_rng(seed)
    picked = list(rng.permutation(differ)[:k]) + list(rng.permutation(same)[:max(0, k - len(differ))])
    return sorted(int(i) for i in picked)


DIRECTIONS = ("t2i", "i2t")


def compare_figure(run_a: str | os.PathLike, sims_a: str | os.PathLike, run_b: str | os.PathLike,
                   sims_b: str | os.PathLike, out_png: str | os.PathLike, queries: int = 3, top_k: int = 4,
                   seed: int = 0, split: str | None = None, machine: str | None = None,
                   direction: str = "t2i") -> dict[str, Any]:
    """Queries answered by two runs of the same split, side by side. ``t2i`` (DVSE Fig. 11: top 4): per query
    caption, run A's top-``k`` images then run B's, the ground truth framed green. ``i2t`` (DVSE Fig. 12: top 5): per
    query image, each run's top-``k`` captions, the image's own marked ✓. Each run's rank of its first ground truth
    beside its name."""
    from xmr.data import load_split
    from xmr.run.config import load_saved_config

    if direction not in DIRECTIONS:
        raise XmrError(f"direction {direction!r}: choose one of {', '.join(DIRECTIONS)}")
    cfg_a, cfg_b = load_saved_config(run_a), load_saved_config(run_b)
    if cfg_a["dataset"] != cfg_b["dataset"]:
        raise XmrError(f"{run_a} is a {cfg_a['dataset']} run, {run_b} a {cfg_b['dataset']} run: compare runs of one "
                       f"dataset")
    ds = cfg_a["dataset_cfg"]
    data = load_split(ds, split or ds["test_split"])
    mats = []
    for path in (sims_a, sims_b):
        m = load_array(path, "similarity matrix")
        if m.shape != (data.num_images, data.num_captions):
            raise XmrError(f"{path}: shape {m.shape} does not match split {data.split!r} ({data.num_images} images "
                           f"x {data.num_captions} captions); score both runs on the same split")
        mats.append(m)
    if not data.image_paths or not all(Path(p).exists() for p in data.image_paths[:1]):
        raise XmrError(f"images of {cfg_a['dataset']} {data.split} are not on disk")
    cap_img = np.asarray(data.caption_image)
    names = [cfg_a["name"], cfg_b["name"]]
    plt = _plt()
    if direction == "t2i":
        picks = disagreeing_queries(mats[0].T, mats[1].T, queries, seed)
        k = min(top_k, data.num_images)
        fig, axes = plt.subplots(len(picks), 2 * k, figsize=(1.7 * 2 * k + 1.8, 2.2 * len(picks) + 0.5),
                                 squeeze=False)
    else:
        picks = disagreeing_queries(mats[0], mats[1], queries, seed)
        k = min(top_k, data.num_captions)
        fig, axes = plt.subplots(len(picks), 3, figsize=(15, 2.3 * len(picks) + 0.5), squeeze=False,
                                 gridspec_kw={"width_ratios": [1, 3, 3]})
    ranks = []
    for row, q in zip(axes, picks):
        rank_pair = []
        for side, m in enumerate(mats):
            if direction == "t2i":
                order = rank_order(m[:, q])
                hits = order == int(cap_img[q])
            else:
                order = rank_order(m[q])
                hits = cap_img[order] == q
            rank_pair.append(int(np.argmax(hits)) + 1)
            label = f"{names[side]}: GT at #{rank_pair[-1]}"
            if direction == "t2i":
                for c, i in enumerate(order[:k]):
                    ax = row[side * k + c]
                    ax.imshow(_load_image(data.image_paths[i]))
                    ax.set_xticks([])
                    ax.set_yticks([])
                    _frame(ax, "green" if hits[c] else "lightgrey", 4 if hits[c] else 1)
                    if c == 0:
                        ax.set_title(label, fontsize=7.5, loc="left")
            else:
                ax = row[1 + side]
                ax.axis("off")
                ax.set_title(label, fontsize=8, loc="left")
                for c, j in enumerate(order[:k]):
                    ax.text(0.0, 1.0 - (c + 0.5) / k, f"#{c + 1} {'✓' if hits[c] else '✗'} "
                            + textwrap.shorten(data.captions[j], 60), fontsize=7.5, va="center",
                            color="green" if hits[c] else "black", transform=ax.transAxes)
        ranks.append(rank_pair)
        if direction == "t2i":
            row[0].set_ylabel("\n".join(textwrap.wrap(f"“{data.captions[q]}”", 24)), fontsize=7, rotation=0,
                              ha="right", va="center", labelpad=6)
        else:
            row[0].imshow(_load_image(data.image_paths[q]))
            row[0].set_xticks([])
            row[0].set_yticks([])
    arrow = "text → image" if direction == "t2i" else "image → text"
    fig.suptitle(f"{arrow}, top-{k}: {names[0]} (left) and {names[1]} (right), {cfg_a['dataset']} {data.split}",
                 fontsize=10)
    _footer(fig, machine)
    _save(fig, out_png)
    return {"queries": picks, "gt_ranks": ranks}


# -- curves over training ---------------------------------------------------------------------------------------

def curves_figure(run_dirs: list[str | os.PathLike], column: str, out_png: str | os.PathLike,
                  labels: list[str] | None = None, machine: str | None = None) -> dict[str, list[tuple[float, float]]]:
    """``column`` of each run's ``history.csv`` per epoch, one line per run (named by ``labels`` or the run's
    folder)."""
    from xmr.core.io import read_history

    if labels and len(labels) != len(run_dirs):
        raise XmrError(f"{len(labels)} labels for {len(run_dirs)} runs: give one label per run")
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    series = {}
    for n, run in enumerate(run_dirs):
        rows = read_history(run)
        pts = [(r["epoch"], r[column]) for r in rows if column in r]
        if not pts:
            have = sorted({c for r in rows for c in r})
            raise XmrError(f"{run}/history.csv has no {column!r} column (it has: {', '.join(have)})")
        name = labels[n] if labels else Path(run).name
        ax.plot(*zip(*pts), marker=".", label=name)
        series[name] = pts
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_ylabel(column)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"{column} over training", fontsize=10)
    _footer(fig, machine)
    _save(fig, out_png)
    return series


__all__ = ["DIRECTIONS", "compare_figure", "curves_figure", "disagreeing_queries", "tsne_figure", "tsne_points"]
