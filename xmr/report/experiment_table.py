"""The table and figure of an experiment (``config/experiments/{name}.yaml``), from its results files.

``table.md``: one row per variant: what the variant changes (or the method, for a comparison of recipes), the
six recalls and RSUM under the first ``rerank`` entry (normally plain), then RSUM under each other re-ranker.
``table.csv``: one row per variant x re-ranker with every number. ``figure.png``: RSUM (and R@1) against the
swept value for a sweep, grouped bars for an ablation or comparison. Missing results files are listed, not fatal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xmr.run.layout import RESULTS_ROOT, RUNS_ROOT
from xmr.core.errors import XmrError
from xmr.studies.experiments import PLAIN, Experiment, resolve_variant
from xmr.core.io import read_json
from xmr.report.tables import EXTENDED, RECALLS, csv_table, fmt, metric_row, run_dir_of, train_seconds
from xmr.run.tracking import flatten


def rerank_label(rerank: str) -> str:
    return "plain" if rerank == PLAIN else rerank


def changes_text(exp: Experiment, variant: str, dataset: str | None = None) -> str:
    """What a variant changes relative to the recipe (common overrides left out: every variant has them); in a
    ladder (``ladder: true``), what the rung changes relative to the rung before it, as ``key: old → new`` of the
    two resolved run configs."""
    names = list(exp.variants)
    if exp.doc.get("ladder") and dataset and names.index(variant) > 0:
        return ladder_step(exp, dataset, names[names.index(variant) - 1], variant)
    over = exp.variants[variant]
    if not over:
        return "recipe as is" if exp.recipe else ""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in over.items())


def ladder_step(exp: Experiment, dataset: str, before: str, after: str) -> str:
    """The model, loss and training settings on which rung ``after`` differs from rung ``before``."""
    a, b = ({k: v for k, v in flatten({s: resolve_variant(exp, name, dataset)[s]
                                     for s in ("model", "loss", "train", "optim")}).items() if k != "train.seed"}
            for name in (before, after))
    diffs = [f"{k}: {json.dumps(a.get(k))} → {json.dumps(b.get(k))}" for k in sorted(set(a) | set(b))
             if a.get(k) != b.get(k)]
    return "; ".join(diffs) or "nothing"


def experiment_rows(exp: Experiment, dataset: str, results_root: str | os.PathLike = RESULTS_ROOT,
                    runs_root: str | os.PathLike = RUNS_ROOT,
                    config_dir: str | os.PathLike = "config") -> tuple[list[dict], list[str]]:
    """(rows, missing): one row per variant x re-ranker whose results file exists; the paths that do not."""
    exp.check_dataset(dataset)
    rows, missing = [], []
    for variant, rerank, path in exp.targets(dataset, results_root, config_dir):
        if not path.exists():
            missing.append(str(path))
            continue
        r = read_json(path)
        if (r.get("rerank") or PLAIN) != rerank:
            raise XmrError(f"{path}: holds re-ranker {r.get('rerank')!r}, expected {rerank!r}; re-evaluate it")
        secs = train_seconds(run_dir_of(r, runs_root))
        rows.append({"experiment": exp.name, "dataset": dataset, "variant": variant, "rerank": rerank,
                     "value": exp.sweep_value(variant), "method": r.get("method"),
                     "changes": changes_text(exp, variant, dataset), "protocol": r.get("protocol"), **metric_row(r),
                     "best_epoch": r.get("best_epoch"), "train (min)": None if secs is None else secs / 60.0})
    return rows, missing


def _by_variant(rows: list[dict]) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for r in rows:
        out.setdefault(r["variant"], {})[r["rerank"]] = r
    return out


def experiment_table_cells(exp: Experiment, rows: list[dict],
                           paper: dict | None = None) -> tuple[list[str], list[list[str]]]:
    """(columns, formatted cells) of the wide table: one row per variant. ``paper``: what the paper prints for
    this experiment (:func:`xmr.report.paper.paper_experiment`), shown as an extra RSUM column."""
    base = exp.rerank[0]
    others = exp.rerank[1:]
    first = ["variant"] + ([exp.sweep_label] if exp.sweep else []) + ["method" if exp.kind == "recipes" else "changes"]
    base_cols = [f"{c} ({rerank_label(base)})" if base != PLAIN else c for c in RECALLS + ["RSUM"] + EXTENDED]
    cols = first + base_cols + [f"RSUM ({rerank_label(o)})" for o in others] + ["train (min)"]
    if paper:
        cols.append(f"paper RSUM ({paper['dataset']})")
    cells = []
    for variant, by_rr in _by_variant(rows).items():
        any_row = next(iter(by_rr.values()))
        b = by_rr.get(base, {})
        line = [variant]
        if exp.sweep:
            line.append(fmt(None) if any_row["value"] is None else str(any_row["value"]))
        line.append(str(any_row["method"] if exp.kind == "recipes" else any_row["changes"]))
        line += [fmt(b.get(c)) for c in RECALLS + ["RSUM"] + EXTENDED]
        line += [fmt(by_rr.get(o, {}).get("RSUM")) for o in others]
        line.append(fmt(any_row["train (min)"]))
        if paper:
            line.append(fmt(paper["rsum"].get(variant)))
        cells.append(line)
    return cols, cells


def experiment_header(exp: Experiment) -> list[str]:
    lines = []
    if exp.doc.get("description"):
        lines.append(exp.doc["description"][0].upper() + exp.doc["description"][1:] + ".")
    if exp.recipe:
        common = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in exp.common_overrides.items())
        lines.append(f"Recipe `{exp.recipe}`" + (f" with {common} for every variant" if common else "") + ".")
    return lines


def missing_note(missing: list[str], show: int = 4) -> str:
    listed = ", ".join(f"`{m}`" for m in missing[:show])
    if len(missing) > show:
        listed += f" and {len(missing) - show} more"
    return f"Not available yet ({len(missing)} results file{'s' if len(missing) > 1 else ''}): {listed}."


def experiment_markdown(exp: Experiment, rows: list[dict], missing: list[str] = (), heading: bool = True,
                        paper: dict | None = None, split: str = "") -> str:
    """The wide Markdown table (variant per row), with the experiment's header (and the split its numbers are
    from) and a note on missing files."""
    lines = []
    if heading:
        lines.append(f"### Experiment `{exp.name}`" + (f" ({exp.doc['paper']})" if exp.doc.get("paper") else ""))
        lines += ["", *experiment_header(exp), *([f"Measured on {split}."] if split else []), ""]
    cols, cells = experiment_table_cells(exp, rows, paper)
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    if paper:
        lines += ["", f"Paper RSUM: {paper['source']} (another dataset: compare trends, not values)."]
    if missing:
        lines += ["", missing_note(missing)]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["experiment", "dataset", "variant", "value", "rerank", "method", "changes", "protocol", *RECALLS,
               "RSUM", *EXTENDED, "i2t R-P", "t2i R-P", "best_epoch", "train (min)"]


def bar_rerankers(rerank: list[str], by_variant: dict[str, dict[str, dict]]) -> list[str]:
    """The re-rankers of a bar chart: those with an RSUM for at least one variant, in the experiment's order."""
    return [rr for rr in rerank if any(by_variant[v].get(rr, {}).get("RSUM") is not None for v in by_variant)]


def plot_experiment(exp: Experiment, rows: list[dict], out_png: str | os.PathLike, title: str | None = None) -> None:
    """Line plot of RSUM and R@1 vs the swept value (sweeps) or grouped RSUM bars (ablations, comparisons)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from xmr.core.io import atomic_path

    by_variant = _by_variant(rows)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    if exp.figure_kind == "line":
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        swept = [v for v in by_variant if isinstance(exp.sweep_value(v), (int, float))]
        swept.sort(key=lambda v: exp.sweep_value(v))
        xs = [exp.sweep_value(v) for v in swept]
        for i, rr in enumerate(exp.rerank):
            c = colours[i % len(colours)]
            pts = [(x, by_variant[v][rr]["RSUM"]) for x, v in zip(xs, swept)
                   if rr in by_variant[v] and by_variant[v][rr]["RSUM"] is not None]
            if pts:
                axes[0].plot(*zip(*pts), marker="o", color=c, label=rerank_label(rr))
            for d, style, marker in (("i2t", "-", "o"), ("t2i", "--", "s")):
                pts = [(x, by_variant[v][rr][f"{d} R@1"]) for x, v in zip(xs, swept)
                       if rr in by_variant[v] and by_variant[v][rr][f"{d} R@1"] is not None]
                if pts:
                    axes[1].plot(*zip(*pts), marker=marker, linestyle=style, color=c,
                                 label=f"{d} R@1 ({rerank_label(rr)})")
            # variants outside the sweep: reference lines
            for j, v in enumerate(v for v in by_variant if v not in swept):
                if rr in by_variant[v] and by_variant[v][rr]["RSUM"] is not None:
                    axes[0].axhline(by_variant[v][rr]["RSUM"], color=c, linestyle=":", linewidth=1)
                    axes[0].annotate(f"{v} ({rerank_label(rr)})", (xs[0] if xs else 0, by_variant[v][rr]["RSUM"]),
                                     fontsize=7, color=c, va="bottom")
        for ax, ylabel in ((axes[0], "RSUM"), (axes[1], "R@1")):
            ax.set_xlabel(exp.sweep_label or "value")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if xs:
                ax.set_xticks(xs)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    else:
        variants = list(by_variant)
        shown = bar_rerankers(exp.rerank, by_variant)  # a partial table: no empty legend entries, no gaps
        n_rr = len(shown)
        width = 0.8 / max(1, n_rr)
        fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(variants) * n_rr + 2), 4.0))
        x = np.arange(len(variants))
        for i, rr in enumerate(shown):
            vals = [by_variant[v].get(rr, {}).get("RSUM") for v in variants]
            heights = [np.nan if h is None else h for h in vals]
            bars = ax.bar(x + (i - (n_rr - 1) / 2) * width, heights, width, label=rerank_label(rr),
                          color=colours[exp.rerank.index(rr) % len(colours)])
            if n_rr * len(variants) <= 40:  # a label on each bar there is, none where a bar is missing
                ax.bar_label(bars, labels=["" if h is None else fmt(h) for h in vals], fontsize=6, rotation=90,
                             padding=2)
        ax.set_xlim(-0.6, len(variants) - 0.4)  # one variant: its bars in the middle, not at an edge
        ax.set_xticks(x, variants, rotation=30 if len(variants) > 1 else 0, ha="right" if len(variants) > 1
                      else "center", fontsize=8)
        ax.set_ylabel("RSUM")
        ax.margins(y=0.18)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="re-ranker", title_fontsize=7)
    import textwrap

    head = title or f"{exp.name}" + (f" ({exp.doc['paper']})" if exp.doc.get("paper") else "")
    fig.suptitle("\n".join(textwrap.wrap(head, int(fig.get_figwidth() * 11))), fontsize=10)
    fig.tight_layout()
    with atomic_path(out_png, ".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def write_experiment_table(exp: Experiment, dataset: str, out_dir: str | os.PathLike | None = None,
                           results_root: str | os.PathLike = RESULTS_ROOT, runs_root: str | os.PathLike = RUNS_ROOT,
                           config_dir: str | os.PathLike = "config", allow_missing: bool = True) -> dict[str, Any]:
    """Write ``table.md``, ``table.csv`` and ``figure.png`` (default folder ``results/{dataset}/exp/{name}``)."""
    from xmr.core.io import atomic_path

    out = Path(out_dir) if out_dir else exp.results_dir(dataset, results_root)
    rows, missing = experiment_rows(exp, dataset, results_root, runs_root, config_dir)
    if missing and not allow_missing:
        raise XmrError(f"experiment {exp.name}: {len(missing)} results files missing, e.g. {missing[0]}; build "
                       f"them with `snakemake -c2 {exp.results_dir(dataset, results_root)}/table.md`")
    if not rows:
        raise XmrError(f"experiment {exp.name}: no results on {dataset} yet (expected e.g. {missing[0]}); build "
                       f"them with `snakemake -c2 {exp.results_dir(dataset, results_root)}/table.md`")
    from xmr.report.paper import paper_experiment

    paper = paper_experiment(exp.name)
    from xmr.studies.benchmark import split_description

    split = split_description(dataset, config_dir)
    for name, text in (("table.md", experiment_markdown(exp, rows, missing, paper=paper, split=split)),
                       ("table.csv", csv_table(rows, CSV_COLUMNS))):
        with atomic_path(out / name, ".tmp") as tmp:
            tmp.write_text(text)
    plot_experiment(exp, rows, out / "figure.png")
    return {"rows": rows, "missing": missing, "table_md": str(out / "table.md"), "table_csv": str(out / "table.csv"),
            "figure": str(out / "figure.png")}


__all__ = ["experiment_rows", "experiment_markdown", "experiment_table_cells", "plot_experiment",
           "write_experiment_table", "changes_text"]
