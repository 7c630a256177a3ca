"""Report figures built from run directories: training curves, retrieval examples, sub-embedding attention maps.

Every function reads files (``history.csv``, ``test_sims.npy``, the dataset's images, a checkpoint) and writes one
PNG; nothing is typed in by hand.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from xmr.core.errors import XmrError


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_png: str | os.PathLike, dpi: int = 100) -> None:
    from xmr.core.io import atomic_path

    with atomic_path(out_png, ".png") as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")
    _plt().close(fig)


# -- training curves -----------------------------------------------------------------------------------------------

def plot_training_curves(histories: dict[str, list[dict[str, float]]], out_png: str | os.PathLike,
                         title: str | None = None) -> None:
    """Validation RSUM and training loss (relative to epoch 1, so methods with different loss scales share an
    axis) per epoch, one line per run."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, rows in histories.items():
        val = [(r["epoch"], r["val_rsum"]) for r in rows if "val_rsum" in r]
        if val:
            axes[0].plot(*zip(*val), marker=".", label=name)
        loss = [(r["epoch"], r["loss"]) for r in rows if "loss" in r]
        if loss and loss[0][1] != 0:
            axes[1].plot([e for e, _ in loss], [v / loss[0][1] for _, v in loss], marker=".", label=name)
    axes[0].set_ylabel("validation RSUM")
    axes[1].set_ylabel("training loss / loss of epoch 1")
    epochs = [r["epoch"] for rows in histories.values() for r in rows if "epoch" in r]
    _finish_epoch_axes(axes, epochs)
    fig.suptitle(title or "training curves", fontsize=10)
    fig.tight_layout()
    _save(fig, out_png)


def epoch_axis(epochs: list[float]) -> tuple[tuple[float, float], list[int]] | None:
    """x-limits and ticks of an epoch axis: whole epochs only, half an epoch of room either side, so that one
    epoch is one point at tick 1 (not ticks 0.96 ... 1.04); None where there are no epochs."""
    if not epochs:
        return None
    lo, hi = int(min(epochs)), int(max(epochs))
    step = max(1, -(-(hi - lo + 1) // 10))  # at most ~10 ticks
    return (lo - 0.5, hi + 0.5), list(range(lo, hi + 1, step))


def _finish_epoch_axes(axes, epochs: list[float] = ()) -> None:
    axis = epoch_axis(list(epochs))
    for ax in axes:
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if axis:
            ax.set_xlim(*axis[0])
            ax.set_xticks(axis[1])
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=2)


# -- retrieval examples ----------------------------------------------------------------------------------------------

def rank_order(scores: np.ndarray) -> np.ndarray:
    """Indices by descending score; ties keep index order (display only; the evaluator ranks ties pessimistically)."""
    return np.argsort(-np.asarray(scores), kind="stable")


def pick_queries(n: int, k: int, seed: int) -> list[int]:
    if n <= 0 or k <= 0:
        return []
    rng = np.random.default_rng(seed)
    return sorted(int(i) for i in rng.choice(n, size=min(k, n), replace=False))


def _load_image(path: Path):
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


def _frame(ax, colour: str, width: float = 4.0) -> None:
    for s in ax.spines.values():
        s.set_visible(True)
        s.set_edgecolor(colour)
        s.set_linewidth(width)


def plot_text_to_image(queries: list[dict], out_png: str | os.PathLike, title: str | None = None) -> None:
    """One row per query caption: its top-k images (ground truth framed green) and, if not among them, the ground
    truth image with its rank. ``queries``: ``{caption, ranked: [(path, is_gt)], gt_path, gt_rank}``."""
    plt = _plt()
    k = max(len(q["ranked"]) for q in queries)
    cols = k + 1
    fig, axes = plt.subplots(len(queries), cols, figsize=(1.9 * cols, 2.35 * len(queries)), squeeze=False)
    for row, q in zip(axes, queries):
        for j, ax in enumerate(row):
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
        for j, (path, is_gt) in enumerate(q["ranked"]):
            ax = row[j]
            ax.imshow(_load_image(path))
            ax.set_title(f"#{j + 1}" + ("  ✓ GT" if is_gt else ""), fontsize=8, color="green" if is_gt else "black")
            _frame(ax, "green" if is_gt else "lightgrey", 4 if is_gt else 1)
        last = row[-1]
        if q["gt_rank"] >= len(q["ranked"]):
            last.imshow(_load_image(q["gt_path"]))
            last.set_title(f"GT at rank {q['gt_rank'] + 1}", fontsize=8, color="darkred")
            _frame(last, "darkred", 2)
        else:
            last.set_visible(False)
        row[0].set_ylabel("\n".join(textwrap.wrap(f"“{q['caption']}”", 26)), fontsize=7.5, rotation=0,
                          ha="right", va="center", labelpad=8)
    fig.suptitle(title or "text → image", fontsize=10)
    fig.tight_layout()
    _save(fig, out_png)


def plot_image_to_text(queries: list[dict], out_png: str | os.PathLike, title: str | None = None) -> None:
    """One row per query image: the image and its top-k captions (ground-truth captions in green with ✓).
    ``queries``: ``{image_path, ranked: [(caption, is_gt)], gt_rank}``."""
    plt = _plt()
    fig, axes = plt.subplots(len(queries), 2, figsize=(10, 2.4 * len(queries)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 3.2]})
    for (ax_img, ax_txt), q in zip(axes, queries):
        ax_img.imshow(_load_image(q["image_path"]))
        ax_img.set_xticks([])
        ax_img.set_yticks([])
        ax_txt.axis("off")
        n = len(q["ranked"])
        for j, (caption, is_gt) in enumerate(q["ranked"]):
            text = f"#{j + 1}  " + ("✓ " if is_gt else "✗ ") + textwrap.shorten(caption, 95)
            ax_txt.text(0.0, 1.0 - (j + 0.5) / (n + 1), text, fontsize=8.5, va="center",
                        color="green" if is_gt else "black", transform=ax_txt.transAxes)
        note = ("first ground-truth caption at rank " + str(q["gt_rank"] + 1)) if q["gt_rank"] >= n else ""
        if note:
            ax_txt.text(0.0, 1.0 - (n + 0.5) / (n + 1), note, fontsize=8, color="darkred", transform=ax_txt.transAxes)
    fig.suptitle(title or "image → text", fontsize=10)
    fig.tight_layout()
    _save(fig, out_png)


def retrieval_examples(run_dir: str | os.PathLike, sims_path: str | os.PathLike, out_dir: str | os.PathLike,
                       queries: int = 2, top_k: int = 5, seed: int = 0, split: str | None = None) -> dict[str, str]:
    """``examples_t2i.png`` and ``examples_i2t.png`` in ``out_dir`` from a run's similarity matrix and its dataset's
    images; returns {direction: path}. Raises XmrError when the images are not on disk."""
    from xmr.data import load_split
    from xmr.run.config import load_saved_config

    run_dir = Path(run_dir)
    cfg = load_saved_config(run_dir)
    ds = cfg["dataset_cfg"]
    data = load_split(ds, split or ds["test_split"])
    sims = np.load(sims_path)
    if sims.shape != (data.num_images, data.num_captions):
        raise XmrError(f"{sims_path}: shape {sims.shape} does not match split {data.split!r} "
                       f"({data.num_images} images x {data.num_captions} captions)")
    missing = [p for p in data.image_paths if not Path(p).exists()]
    if not data.image_paths or missing:
        raise XmrError(f"images of {cfg['dataset']} {data.split} are not on disk "
                       f"(e.g. {missing[0] if missing else 'no image paths'})")
    cap_img = np.asarray(data.caption_image)
    k = min(top_k, data.num_images, data.num_captions)
    t2i = []
    for j in pick_queries(data.num_captions, queries, seed):
        order = rank_order(sims[:, j])
        gt = int(cap_img[j])
        t2i.append({"caption": data.captions[j], "gt_path": data.image_paths[gt],
                    "gt_rank": int(np.nonzero(order == gt)[0][0]),
                    "ranked": [(data.image_paths[i], int(i) == gt) for i in order[:k]]})
    i2t = []
    for i in pick_queries(data.num_images, queries, seed + 1):
        order = rank_order(sims[i])
        is_gt = cap_img[order] == i
        i2t.append({"image_path": data.image_paths[i], "gt_rank": int(np.argmax(is_gt)) if is_gt.any() else k,
                    "ranked": [(data.captions[j], bool(g)) for j, g in zip(order[:k], is_gt[:k])]})
    out = Path(out_dir)
    name = cfg["name"]
    paths = {}
    if t2i:
        paths["t2i"] = str(out / "examples_t2i.png")
        plot_text_to_image(t2i, paths["t2i"], f"text → image: top-{k} of {name} ({cfg['dataset']} {data.split})")
    if i2t:
        paths["i2t"] = str(out / "examples_i2t.png")
        plot_image_to_text(i2t, paths["i2t"], f"image → text: top-{k} of {name} ({cfg['dataset']} {data.split})")
    return paths


# -- sub-embedding attention (DVSE Fig. 10) ------------------------------------------------------------------------

def image_attention(model, feats, num_regions) -> tuple[np.ndarray, np.ndarray | None]:
    """(attention (B, K, R), mask (B, K) or None) of a set-based model's image heads.

    Uses the ``image_attention`` of the method's ``image_outputs`` when it gives one; otherwise PIE-Net heads
    (PVSE, DVSE) are asked directly (their attention does not depend on the dynamic mask)."""
    import torch

    with torch.no_grad():
        out = model.image_outputs(feats, num_regions)
        attn = out.get("image_attention")
        if attn is None:
            # DVSE on its VSE∞ base holds its PIE-Net as image_pie; PVSE (and DVSE's PVSE reading) in image_head
            pie = getattr(model, "image_pie", None) or getattr(getattr(model, "image_head", None), "pie", None)
            if pie is None:
                raise XmrError(f"method {model.method_name!r} exposes no per-sub-embedding attention (needs "
                               f"PIE-Net image heads, or image_attention in its image_outputs)")
            _, attn = pie.attention(feats, num_regions)
        mask = out.get("mask")
    return attn.float().cpu().numpy(), None if mask is None else mask.float().cpu().numpy()


def attention_to_pixels(weights: np.ndarray, size: tuple[int, int], boxes: np.ndarray | None = None) -> np.ndarray:
    """A (H, W) map of one head's attention over the image: grid features (R = g x g cells, row-major) are
    upsampled bilinearly; region features spread each region's weight over its box (overlaps add up)."""
    from PIL import Image

    w, h = size
    if boxes is not None:
        heat = np.zeros((h, w), dtype=np.float64)
        for a, (x1, y1, x2, y2) in zip(weights, boxes):
            heat[max(0, int(y1)):max(0, int(np.ceil(y2))), max(0, int(x1)):max(0, int(np.ceil(x2)))] += a
        return heat
    r = len(weights)
    g = int(round(np.sqrt(r)))
    if g * g != r:
        raise XmrError(f"{r} grid cells are not a square grid; cannot place attention on the image")
    cell = Image.fromarray(np.asarray(weights, dtype=np.float32).reshape(g, g), mode="F")
    return np.asarray(cell.resize((w, h), Image.BILINEAR), dtype=np.float64)


def plot_attention_maps(items: list[dict], out_png: str | os.PathLike, title: str | None = None,
                        footer: str | None = None) -> None:
    """One row per image: the image, then each sub-embedding's map over it. ``items``:
    ``{image_path, maps: [(H, W) arrays], mask: (K,) or None}``, optionally ``captions`` (one per map, shown under
    it: DivE Fig. 4's nearest caption of each set element) and ``labels`` (one title per map)."""
    plt = _plt()
    k = max(len(it["maps"]) for it in items)
    with_text = any(it.get("captions") for it in items)
    fig, axes = plt.subplots(len(items), k + 1, figsize=((2.4 if with_text else 1.8) * (k + 1),
                                                         (3.0 if with_text else 2.15) * len(items) + 0.5),
                             squeeze=False)
    for row, it in zip(axes, items):
        img = np.asarray(_load_image(it["image_path"]))
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].imshow(img)
        row[0].set_title("image", fontsize=8)
        for j, heat in enumerate(it["maps"]):
            ax = row[j + 1]
            ax.imshow(img)
            hi = heat.max()
            ax.imshow(heat / hi if hi > 0 else heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
            off = it["mask"] is not None and it["mask"][j] == 0
            label = it["labels"][j] if it.get("labels") else f"k={j + 1}"
            ax.set_title(label + (" (masked)" if off else ""), fontsize=8, color="grey" if off else "black")
            if it.get("captions"):
                ax.set_xlabel("\n".join(textwrap.wrap(f"“{it['captions'][j]}”", 30)[:4]), fontsize=6.5)
        for ax in row[len(it["maps"]) + 1:]:
            ax.set_visible(False)
    fig.suptitle(title or "sub-embedding attention", fontsize=10)
    if footer:
        fig.text(0.99, 0.005, footer, fontsize=6, color="grey", ha="right", va="bottom")
    fig.tight_layout(rect=(0, 0.02 if footer else 0, 1, 1))
    _save(fig, out_png)


def produced_on(machine: str | None = None) -> str:
    """The footer every analysis figure carries: the machine that drew it (``machine``, else the CPU's model name
    and core count from /proc/cpuinfo) and the date."""
    import datetime

    if machine is None:
        cpu, flags = "unknown CPU", []
        try:
            with open("/proc/cpuinfo") as f:
                first = f.read().split("\n\n")[0]  # the first processor's block
            info = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
            cpu, flags = info.get("model name", cpu), info.get("flags", "").split()
        except OSError:
            pass
        machine = (f"{os.cpu_count()}-core {cpu}" + (" VM" if "hypervisor" in flags else "")
                   + (" with AVX-512" if "avx512f" in flags else ""))
    return f"made by xmr on {machine}, {datetime.date.today().isoformat()}"


def region_similarity(model, feats, num_regions) -> np.ndarray:
    """(B, K, R): the cosine of each region's (or grid cell's) joint-space feature with each image sub-embedding
    (DVSE Fig. 10 ranks regions this way). Needs the method's per-region projection into the joint space
    (``image_proj``: DVSE on its VSE∞ base, DivE, VSE∞)."""
    import torch

    proj = getattr(model, "image_proj", None)
    with torch.no_grad():
        emb = model.image_outputs(feats, num_regions)["img"]
        if proj is None or emb.ndim != 3:
            raise XmrError(f"method {model.method_name!r} has no per-region features in the joint space and image "
                           f"sub-embeddings to compare them with (needs image_proj and (B, K, D) embeddings: DVSE "
                           f"with image_projection: per_region, DivE)")
        regions = torch.nn.functional.normalize(proj(feats).float(), dim=-1)
        sims = torch.einsum("bkd,brd->bkr", torch.nn.functional.normalize(emb.float(), dim=-1), regions)
    return sims.cpu().numpy()


def rank_scores(similarity: np.ndarray) -> np.ndarray:
    """DVSE Fig. 10's region scores: each region's rank r (1 = most similar) among the R regions of a row of
    ``similarity`` (K, R) turned into a = (R - r)², the paper's ρ·(R - r_i)² without ρ (a common scale, gone once
    a map is normalised by its maximum)."""
    order = np.argsort(-similarity, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, similarity.shape[1] + 1)[None].repeat(len(similarity), 0), axis=1)
    return (similarity.shape[1] - ranks).astype(np.float64) ** 2


def nearest_captions(element: np.ndarray, text_emb: np.ndarray) -> list[int]:
    """For each image set element (K, D), the caption whose embedding (M, D) or set (M, L, D) holds the most
    similar vector (highest cosine)."""
    unit = lambda v: v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    txt = unit(np.asarray(text_emb, dtype=np.float64))
    if txt.ndim == 2:
        txt = txt[:, None, :]
    cos = np.einsum("kd,mld->kml", unit(np.asarray(element, dtype=np.float64)), txt).max(axis=2)  # (K, M)
    return [int(j) for j in cos.argmax(axis=1)]


MAP_KINDS = ("attention", "similarity")


def attention_figure(run_dir: str | os.PathLike, out_png: str | os.PathLike, images: int = 2, seed: int = 0,
                     split: str | None = None, device: str = "cpu", weights: str = "attention",
                     with_captions: bool = False, machine: str | None = None) -> dict[str, Any]:
    """Maps of each image sub-embedding over test images from a trained set-based run. ``weights``:
    ``attention`` (the heads' attention weights: PVSE/DVSE's PIE-Net, DivE's slot attention, DivE Fig. 4) or
    ``similarity`` (DVSE Fig. 10: regions ranked by their cosine with the sub-embedding, scored (R - r)², the top
    three named).
    ``with_captions``: under each map, the test caption nearest to that set element (DivE Fig. 4, A2, A3).
    ``machine`` names the machine in the footer (default: the CPU's name)."""
    import torch

    from xmr.inference.loaders import image_input, image_loader_parts, load_split_images
    from xmr.inference.model import load_trained
    from xmr.settings.run_settings import run_settings

    if weights not in MAP_KINDS:
        raise XmrError(f"map weights {weights!r}: choose one of {', '.join(MAP_KINDS)}")
    model, cfg = load_trained(run_dir, device)
    split = split or cfg["dataset_cfg"]["test_split"]
    settings = run_settings(cfg)
    data, source = load_split_images(settings.image, settings.dataset_config, split)  # features, or image files
    picks = pick_queries(data.num_images, images, seed)
    if not picks:
        raise XmrError(f"no images to show for {run_dir}")
    boxes = getattr(source, "boxes", lambda: None)()
    sizes = getattr(source, "image_sizes", lambda: None)()
    dataset, collate = image_loader_parts(source, picks, cfg["features"]["max_regions"])
    gallery = None
    if with_captions:
        from xmr.inference.model import load

        gallery = load(run_dir, device).encode_split(split)  # the run's cached test embeddings when they exist
    items = []
    for k, i in enumerate(picks):
        with torch.no_grad():
            x, num = model.image_local_features(*image_input(collate([dataset[k]]), device))
        n = int(num[0])
        attn, mask = image_attention(model, x, num) if weights == "attention" else (region_similarity(model, x, num),
                                                                                     None)
        path = Path(data.image_paths[i]) if data.image_paths else None
        if path is None or not path.exists():
            raise XmrError(f"image {data.image_ids[i]} of {cfg['dataset']} {split} is not on disk ({path})")
        from PIL import Image

        with Image.open(path) as im:
            size = im.size
        b = None
        if boxes is not None:
            b = boxes[i][:n].astype(np.float64)
            if sizes is not None and tuple(sizes[i]) != size:  # boxes are in original-image pixels
                b = b * np.array([size[0] / sizes[i][0], size[1] / sizes[i][1]] * 2)
        maps = attn[0][:, :n]
        item = {"image_path": path, "mask": None if mask is None else mask[0]}
        if weights == "similarity":
            order = np.argsort(-maps, axis=1, kind="stable")
            item["labels"] = [f"k={j + 1}: top {', '.join(str(r + 1) for r in t[:3])}" for j, t in enumerate(order)]
            maps = rank_scores(maps)
        item["maps"] = [attention_to_pixels(a, size, b) for a in maps]
        if gallery is not None:
            near = nearest_captions(np.asarray(gallery["image_emb"][i]), gallery["text_emb"])
            item["captions"] = [gallery["captions"][j] for j in near]
            item["nearest"] = near
        items.append(item)
    what = "regions ranked by cosine with" if weights == "similarity" else "attention of"
    plot_attention_maps(items, out_png, f"{what} each image sub-embedding" + (" and its nearest caption"
                                                                              if with_captions else "")
                        + f": {cfg['name']} ({cfg['dataset']} {split})", produced_on(machine))
    return {"images": [data.image_ids[i] for i in picks], "num_embeds": len(items[0]["maps"]),
            "nearest_captions": [it.get("nearest") for it in items]}


__all__ = ["plot_training_curves", "retrieval_examples", "plot_text_to_image",
           "plot_image_to_text", "image_attention", "attention_to_pixels", "plot_attention_maps", "attention_figure",
           "rank_order", "pick_queries", "produced_on", "region_similarity", "rank_scores", "nearest_captions", "MAP_KINDS"]
