"""FR scale sensitivity (DVSE Fig. 7): retrieval quality over a grid of Fast Re-ranking scales.

FR scores image->text with (γ1, γ2) only and text->image with (λ1, λ2) only (DVSE Eq. 15; ``xmr.rerank.fast``),
so the grid factorises: the image->text recalls over γ1 x γ2 and the text->image recalls over λ1 x λ2 give RSUM
for every combination. Three grids are reported:

- ``i2t``: image->text R@1, R@5, R@10 and their sum over (γ1 rows, γ2 columns), as the paper's Fig. 7 (left);
- ``t2i``: text->image recalls over (λ1 rows, λ2 columns) (Fig. 7, right);
- ``rsum``: RSUM with tied scales (γ1 = γ2 = γ rows, λ1 = λ2 = λ columns) = i2t sum(γ, γ) + t2i sum(λ, λ).

Every number comes from :func:`xmr.evaluation.evaluate_sims` with ``rerank="fr"``. Tune on the validation split
(method card A15), not on test.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from xmr.core.errors import XmrError

KS = (1, 5, 10)


def fr_grid(sims, gammas: Sequence[float], lambdas: Sequence[float], protocol: str = "plain",
            captions_per_image: int = 5, image_labels=None, rerank_defaults: str | None = None,
            extra_params: dict | None = None, device: str | None = None) -> dict[str, Any]:
    """Evaluate FR on ``sims`` over the (γ1, γ2) and (λ1, λ2) grids; returns a JSON-friendly dict."""
    from xmr.evaluation import evaluate_sims

    gammas, lambdas = [float(g) for g in gammas], [float(v) for v in lambdas]
    for name, values in (("gammas", gammas), ("lambdas", lambdas)):
        if not values:
            raise XmrError(f"fr-grid: --{name} needs at least one value")
        if any(not v > 0 for v in values):
            raise XmrError(f"fr-grid: --{name} values must be > 0, got {values}")
    kw: dict[str, Any] = {"protocol": protocol, "captions_per_image": captions_per_image,
                          "rerank_defaults": rerank_defaults, "device": device}
    if image_labels is not None:
        kw["image_labels"] = image_labels
    plain = evaluate_sims(sims, **kw)
    i2t_points = [(a, b) for a in range(len(gammas)) for b in range(len(gammas))]
    t2i_points = [(a, b) for a in range(len(lambdas)) for b in range(len(lambdas))]
    i2t = np.zeros((len(gammas), len(gammas), len(KS)))
    t2i = np.zeros((len(lambdas), len(lambdas), len(KS)))
    # one evaluation serves an i2t point and a t2i point at once (each direction sees only its own scales)
    for k in range(max(len(i2t_points), len(t2i_points))):
        ga, gb = i2t_points[min(k, len(i2t_points) - 1)]
        la, lb = t2i_points[min(k, len(t2i_points) - 1)]
        params = dict(extra_params or {}) | {"gamma1": gammas[ga], "gamma2": gammas[gb],
                                            "lambda1": lambdas[la], "lambda2": lambdas[lb]}
        m = evaluate_sims(sims, rerank="fr", rerank_params=params, **kw)
        if k < len(i2t_points):
            i2t[ga, gb] = [m["i2t"][f"r{x}"] for x in KS]
        if k < len(t2i_points):
            t2i[la, lb] = [m["t2i"][f"r{x}"] for x in KS]
    i2t_sum, t2i_sum = i2t.sum(-1), t2i.sum(-1)
    rsum = np.diagonal(i2t_sum)[:, None] + np.diagonal(t2i_sum)[None, :]
    gi, li = np.unravel_index(int(np.argmax(rsum)), rsum.shape)
    a1, a2 = np.unravel_index(int(np.argmax(i2t_sum)), i2t_sum.shape)
    b1, b2 = np.unravel_index(int(np.argmax(t2i_sum)), t2i_sum.shape)
    plain_rsum = sum(plain[d][f"r{x}"] for d in ("i2t", "t2i") for x in KS)
    return {
        "protocol": protocol, "gammas": gammas, "lambdas": lambdas, "extra_params": dict(extra_params or {}),
        "plain": {"i2t": {f"r{x}": plain["i2t"][f"r{x}"] for x in KS},
                  "t2i": {f"r{x}": plain["t2i"][f"r{x}"] for x in KS}, "rsum": plain_rsum},
        "i2t": {**{f"r{x}": i2t[..., j].tolist() for j, x in enumerate(KS)}, "sum": i2t_sum.tolist()},
        "t2i": {**{f"r{x}": t2i[..., j].tolist() for j, x in enumerate(KS)}, "sum": t2i_sum.tolist()},
        "rsum": rsum.tolist(),
        "best": {"tied": {"gamma": gammas[gi], "lambda": lambdas[li], "rsum": float(rsum[gi, li])},
                 "free": {"gamma1": gammas[a1], "gamma2": gammas[a2], "lambda1": lambdas[b1], "lambda2": lambdas[b2],
                          "rsum": float(i2t_sum[a1, a2] + t2i_sum[b1, b2])}},
    }


def grid_csv(grid: dict) -> str:
    """Long format: one row per grid cell of each of the three grids."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["grid", "row_param", "row_value", "col_param", "col_value", "r1", "r5", "r10", "value"])
    for d, (p1, p2), values in (("i2t", ("gamma1", "gamma2"), grid["gammas"]),
                                ("t2i", ("lambda1", "lambda2"), grid["lambdas"])):
        for a, va in enumerate(values):
            for b, vb in enumerate(values):
                w.writerow([d, p1, va, p2, vb, *(grid[d][f"r{x}"][a][b] for x in KS), grid[d]["sum"][a][b]])
    for a, g in enumerate(grid["gammas"]):
        for b, lam in enumerate(grid["lambdas"]):
            w.writerow(["rsum", "gamma", g, "lambda", lam, "", "", "", grid["rsum"][a][b]])
    return buf.getvalue()


def _num(v: float) -> str:
    return f"{v:g}"


def plot_fr_grid(grid: dict, out_png: str | os.PathLike, title: str | None = None,
                 defaults: dict | None = None) -> None:
    """Three heat maps: i2t recall sum over (γ1, γ2), t2i over (λ1, λ2), RSUM over tied (γ, λ).
    ``defaults`` (FR's parameters for the dataset) are outlined when they lie on the grid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from xmr.core.io import atomic_path

    g, lam = grid["gammas"], grid["lambdas"]
    panels = [
        (np.array(grid["i2t"]["sum"]), g, g, "γ1", "γ2", "image→text R@1+R@5+R@10",
         (defaults or {}).get("gamma1"), (defaults or {}).get("gamma2")),
        (np.array(grid["t2i"]["sum"]), lam, lam, "λ1", "λ2", "text→image R@1+R@5+R@10",
         (defaults or {}).get("lambda1"), (defaults or {}).get("lambda2")),
        (np.array(grid["rsum"]), g, lam, "γ = γ1 = γ2", "λ = λ1 = λ2", "RSUM (tied scales)",
         (defaults or {}).get("gamma1") if defaults and defaults.get("gamma1") == defaults.get("gamma2") else None,
         (defaults or {}).get("lambda1") if defaults and defaults.get("lambda1") == defaults.get("lambda2") else None),
    ]
    size = max(len(g), len(lam))
    cell = 0.42 if size > 8 else 0.55
    fig, axes = plt.subplots(1, 3, figsize=(3 * (1.6 + cell * size), 1.6 + cell * size))
    for ax, (m, rows, cols, rlabel, clabel, name, rdef, cdef) in zip(axes, panels):
        im = ax.imshow(m, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(cols)), [_num(v) for v in cols], rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), [_num(v) for v in rows], fontsize=7)
        ax.set_xlabel(clabel)
        ax.set_ylabel(rlabel)
        ax.set_title(name, fontsize=9)
        if m.size <= 144:
            lo, hi = float(m.min()), float(m.max())
            for i in range(m.shape[0]):
                for j in range(m.shape[1]):
                    ax.text(j, i, f"{m[i, j]:.0f}", ha="center", va="center", fontsize=5.5,
                            color="black" if hi > lo and (m[i, j] - lo) / (hi - lo) > 0.6 else "white")
        bi, bj = np.unravel_index(int(np.argmax(m)), m.shape)
        ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.8))
        if rdef in rows and cdef in cols:
            ax.add_patch(Rectangle((cols.index(cdef) - 0.5, rows.index(rdef) - 0.5), 1, 1, fill=False,
                                   edgecolor="white", linewidth=1.5, linestyle="--"))
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    head = title or "FR scale sensitivity"
    fig.suptitle(f"{head} — plain RSUM {grid['plain']['rsum']:.1f}, "
                 f"best tied RSUM {grid['best']['tied']['rsum']:.1f} "
                 f"(red: best cell; white dashed: configured FR scales)", fontsize=9)
    fig.tight_layout()
    with atomic_path(out_png, ".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def run_fr_grid(run_dir: str | os.PathLike, sims_path: str | os.PathLike, gammas: Sequence[float],
                lambdas: Sequence[float], out_dir: str | os.PathLike, split: str | None = None,
                protocol: str | None = None, device: str | None = None) -> dict[str, Any]:
    """``fr_grid.{json,csv,png}`` in ``out_dir`` for a trained run's similarity matrix ``sims_path``.

    ``split`` (default: the test split) only matters for class labels (CUB). ``protocol`` defaults to the
    dataset's headline protocol when the matrix has the shape it needs, else ``plain`` (e.g. a validation split).
    """
    from xmr.config.loader import rerank_params
    from xmr.core.io import atomic_path, write_json
    from xmr.evaluation import PROTOCOLS
    from xmr.run.config import load_saved_config

    run_dir = Path(run_dir)
    cfg = load_saved_config(run_dir)
    if not Path(sims_path).exists():
        raise XmrError(f"{sims_path}: similarity matrix not found; run `xmr score --run {run_dir}"
                       f"{' --split ' + split if split else ''}` first")
    sims = np.load(sims_path)
    ds = cfg["dataset_cfg"]
    split = split or ds["test_split"]
    cpi = ds["captions_per_image"]
    if protocol is None:
        head = (cfg["eval"]["protocols"] or ds["protocols"])[0]
        p = PROTOCOLS[head]
        fits = p.shape is None or tuple(sims.shape) == p.shape
        protocol = head if fits else "plain"
    labels = None
    if protocol == "cub":
        from xmr.data import load_split

        labels = load_split(ds, split).image_labels
    # FR's other options (pool, exclude_self) as the run evaluates them
    defaults = rerank_params("fr", ds["rerank_defaults"], cfg["eval"]["rerank"])
    extra = {k: v for k, v in defaults.items() if k not in ("gamma1", "gamma2", "lambda1", "lambda2")}
    grid = fr_grid(sims, gammas, lambdas, protocol, cpi, labels, ds["rerank_defaults"], extra, device)
    grid.update({"run": str(run_dir), "recipe": cfg["name"], "method": cfg["method"], "dataset": cfg["dataset"],
                 "split": split, "sims": str(sims_path),
                 "configured": {k: defaults[k] for k in ("gamma1", "gamma2", "lambda1", "lambda2")}})
    out = Path(out_dir)
    write_json(out / "fr_grid.json", grid)
    with atomic_path(out / "fr_grid.csv", ".tmp") as tmp:
        tmp.write_text(grid_csv(grid))
    plot_fr_grid(grid, out / "fr_grid.png", f"{cfg['name']} on {cfg['dataset']} {split} ({protocol})",
                 grid["configured"])
    return grid


__all__ = ["fr_grid", "grid_csv", "plot_fr_grid", "run_fr_grid"]
