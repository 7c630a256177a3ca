"""The seeded benchmark: ``config/benchmark/{name}.yaml`` (schema ``xmr/schemas/benchmark.schema.yaml``).

Every variant (a recipe plus overrides) is trained once per seed into ``runs/{dataset}/bench/{name}/{variant}/s{seed}/``
and evaluated once, plain and with every re-ranker of the file, into
``results/{dataset}/bench/{name}/{variant}/s{seed}.json`` (:func:`xmr.run.results.evaluate_run_many`). Then
:func:`write_benchmark` gathers them into ``results/{dataset}/{name}.{md,csv,json,png}`` (mean ± std over seeds, on
the whole test split and on each evaluation subset of the dataset, e.g. synth's ``ambiguous`` queries; how each run's
training ended and the spread of its test matrix, collapsed runs flagged), ``{name}_curves.png`` (validation curves)
and ``results/{dataset}/{name}_claims.{md,csv}``: each claim of a seed paper with our difference and a verdict.

Verdicts (docs/benchmark.md "Verdicts"; :mod:`xmr.studies.claims`): one-sided t tests in the claimed direction
(paired over seeds when both sides are the same trained models, with a query-level paired bootstrap beside it; else
Welch's), a one-sided non-superiority test against the file's ``smallest_effect``, an exact permutation test over
seeds beside each, Holm's step-down rule within each family across every benchmark file; each verdict is scoped to
the dataset (*holds on synth*, *reversed on synth*, *no effect ≥ Δ on synth*, *underpowered on synth*). Both sides
must differ only in declared settings (:func:`claim_differences`).

The file, its loading, the declared differences and the per-seed records are :mod:`xmr.studies.benchmark_config`'s;
this module gathers how the runs trained and writes the tables; the names of both it imports stay importable here.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np

from xmr.evaluation.stats import compare, holm, mean_std, t_test  # noqa: F401 - the statistics of the claims
from xmr.run.layout import RESULTS_ROOT, RUNS_ROOT, results_dir
from xmr.studies.benchmark_config import (ALL, EXTENDED_METRICS, METRICS, PLAIN, Benchmark, _values,
                                          check_trained_alike, gather, set_metrics)
from xmr.studies.claims import _pm, claims_markdown, judge_claims
# the benchmark file and the claims' tests, importable from here as before (docs/benchmark.md names them here)
from xmr.studies.benchmark_config import (LOWER_IS_BETTER, META_KEYS, METHOD_SETTINGS, SCHEDULE_READS,  # noqa: F401
                                          SET_METRICS, TRAINED_ALIKE, Difference, benchmark_names, benchmark_path,
                                          claim_differences, differs_text, flat_metrics, inert_keys, load_benchmark,
                                          load_method_settings, path_metric)
from xmr.studies.claims import (ALPHA, HOLDS, NO_EFFECT, QUERY_CUTOFFS, REVERSED, UNDERPOWERED,  # noqa: F401
                                query_differences, query_level, ranks_path, verdict)


def median_epoch_seconds(run_dir: str | os.PathLike) -> float | None:
    """The median of a run's epoch times (``history.csv``'s ``seconds``): what an epoch takes, unmoved by an epoch
    that stalled (a paused or resumed run, other work on the machine), which ``train_seconds`` counts in full."""
    path = Path(run_dir) / "history.csv"
    if not path.exists():
        return None
    from xmr.core.io import read_history

    secs = [r["seconds"] for r in read_history(run_dir) if "seconds" in r]
    return float(np.median(secs)) if secs else None


IN_BATCH = (32, 128)  # batch sizes of the in-batch top-1 column: the synth recipes' two batch sizes


def gather_training(bench: Benchmark, results_root: str | os.PathLike = RESULTS_ROOT,
                    runs_root: str | os.PathLike = RUNS_ROOT) -> list[dict]:
    """One record per (variant, seed) present: how its training ended and the spread of its test matrix (what
    each per-seed results file repeats from the run; NaN / None for results written before they were recorded),
    and the in-batch top-1 of its scored test matrix (``runs/.../test_sims.npy``) at each batch of ``IN_BATCH``."""
    from xmr.core.io import read_json
    from xmr.evaluation.spread import in_batch_top1

    out = []
    for variant in bench.variants:
        for seed in bench.seeds:
            p = bench.result_path(variant, seed, results_root)
            if not p.exists():
                continue
            doc = read_json(p)
            spread = doc.get("similarity_spread") or {}
            sims_file = bench.run_dir(variant, seed, runs_root) / "test_sims.npy"
            sims = np.load(sims_file) if sims_file.exists() else None
            # a per-seed file holds one evaluation per re-ranker (by_rerank); the split's facts are in each
            per_caption = (doc.get("by_rerank") or {}).get(PLAIN, doc).get("captions_per_image")
            top1 = {f"in_batch_top1_b{b}": (in_batch_top1(np.asarray(sims), int(per_caption), b)
                                            if sims is not None and per_caption and sims.shape[0] >= b
                                            else float("nan"))
                    for b in IN_BATCH}
            usage = (doc.get("set_statistics") or {}).get("slot_usage") or {}
            out.append({"variant": variant, "seed": seed, "epochs_trained": doc.get("epochs_trained"),
                        "best_epoch": doc.get("best_epoch"), "stopped_by": doc.get("stopped_by"),
                        "train_seconds": doc.get("train_seconds"),
                        "epoch_seconds": median_epoch_seconds(bench.run_dir(variant, seed, runs_root)),
                        "sim_std": float(spread.get("std", float("nan"))),
                        "sim_margin": float(spread.get("margin", float("nan"))),
                        "collapsed": bool(spread) and float(spread["std"]) < bench.degenerate_std, **top1,
                        **set_metrics(doc), "slot_entropy": float(usage.get("entropy_normalised", float("nan")))})
    return out


def training_markdown(bench: Benchmark, training: list[dict]) -> str:
    """Per variant: epochs trained, how training ended, seconds per epoch, the test matrix's spread, with
    collapsed runs (std below ``degenerate_std``) flagged, and for set methods how far apart the sub-embeddings are
    (mean off-diagonal cosine of an image's sub-embeddings; slot usage's normalised entropy)."""
    out = io.StringIO()
    out.write(f"**Training and similarity spread** (per variant over its seeds; test similarities: std and the mean "
              f"margin between each query's best positive and its hardest negative; ⚠ = a run with std < "
              f"{bench.degenerate_std:g}, i.e. collapsed; set methods: *set corr.* = mean off-diagonal cosine of an "
              f"image's final sub-embeddings over the test images (DVSE Fig. 6's measure; 1 = one vector), *slot "
              f"entropy* = entropy of which sub-embedding scores each positive pair highest, over log2 K (1 = all "
              f"used alike, 0 = one))\n\n")
    top1_heads = " | ".join(f"top-1 B {b}" for b in IN_BATCH)
    out.write(f"| variant | batch | epochs trained | best epoch | ended by | s / epoch | min / run | test sim. std | "
              f"margin | {top1_heads} | set corr. | slot entropy | collapsed |\n|---|---|---|---|---|---|---|---|---|"
              + "---|" * len(IN_BATCH) + "---|---|---|\n")
    for v in bench.variants:
        recs = [r for r in training if r["variant"] == v]
        if not recs:
            continue

        def span(key: str) -> str:
            vals = [r[key] for r in recs if r[key] is not None]
            if not vals:
                return "–"
            return f"{min(vals)}" if min(vals) == max(vals) else f"{min(vals)}–{max(vals)}"

        ends = [r["stopped_by"] for r in recs if r["stopped_by"]]
        ended = ", ".join(f"{e} ×{ends.count(e)}" for e in dict.fromkeys(ends)) or "–"
        # each run's median epoch (its measured mean when no history is kept), times its epochs
        timed = [r for r in recs if r["train_seconds"] and r["epochs_trained"]]
        per_epoch = [r.get("epoch_seconds") or r["train_seconds"] / r["epochs_trained"] for r in timed]
        sec = f"{np.mean(per_epoch):.0f}" if per_epoch else "–"
        minutes = [p * r["epochs_trained"] / 60 for p, r in zip(per_epoch, timed)]
        per_run = f"{np.mean(minutes):.1f}" if minutes else "–"
        std_m, std_s = mean_std(r["sim_std"] for r in recs)
        mar_m, mar_s = mean_std(r["sim_margin"] for r in recs)
        n_col = sum(r["collapsed"] for r in recs)
        top1 = " | ".join(_pm(*mean_std(r.get(f"in_batch_top1_b{b}", float("nan")) for r in recs), 2)
                          for b in IN_BATCH)
        corr = _pm(*mean_std(r.get("correlation", float("nan")) for r in recs), 3)
        entropy = _pm(*mean_std(r.get("slot_entropy", float("nan")) for r in recs), 2)
        batch = bench.run_config(v, bench.seeds[0])["train"]["batch_size"]
        out.write(f"| {v} | {batch} | {span('epochs_trained')} | {span('best_epoch')} | {ended} | {sec} | {per_run} | "
                  f"{_pm(std_m, std_s, 4)} | {_pm(mar_m, mar_s, 4)} | {top1} | {corr} | {entropy} | "
                  f"{f'⚠ {n_col} of {len(recs)}' if n_col else 'no'} |\n")
    out.write("\n")
    return out.getvalue()


def run_histories(bench: Benchmark, runs_root: str | os.PathLike = RUNS_ROOT) -> dict[str, list[list[dict]]]:
    """``{variant: [history rows of each seed's run]}`` for the runs that have a history.csv."""
    from xmr.core.io import read_history

    out: dict[str, list[list[dict]]] = {}
    for v in bench.variants:
        runs = [read_history(bench.run_dir(v, s, runs_root)) for s in bench.seeds
                if (bench.run_dir(v, s, runs_root) / "history.csv").exists()]
        if runs:
            out[v] = runs
    return out


# ------------------------------------------------------------------------------------------------- writing


def summary_rows(bench: Benchmark, records: list[dict]) -> list[dict]:
    """Mean and std over seeds of every metric, per (variant, re-ranker, subset)."""
    rows = []
    subsets = list(dict.fromkeys(r["subset"] for r in records))
    for variant in bench.variants:
        for rerank in bench.rerank:
            for subset in subsets:
                row = {"variant": variant, "label": bench.label(variant), "rerank": rerank, "subset": subset}
                for m in METRICS:
                    vals = _values(records, variant, rerank, subset, m)
                    if not vals:
                        break
                    row[f"{m}_mean"], row[f"{m}_std"] = mean_std(vals.values())
                    row["seeds"] = len(vals)
                else:
                    for m in EXTENDED_METRICS:  # beside RSUM; NaN where the results files have none
                        row[f"{m}_mean"], row[f"{m}_std"] = mean_std(
                            v for v in _values(records, variant, rerank, subset, m).values() if math.isfinite(v))
                    rows.append(row)
    return rows


def timing(bench: Benchmark, runs_root: str | os.PathLike = RUNS_ROOT,
           results_root: str | os.PathLike = RESULTS_ROOT) -> dict[str, float]:
    """Training minutes summed over runs (their train.json) and the wall span from the first run's start (its
    config.yaml) to the last results file."""
    from xmr.core.io import read_json

    train_s, median_s, starts, ends = 0.0, 0.0, [], []
    for v in bench.variants:
        if v in bench.shared:  # the runs of runs_from, timed there
            continue
        for s in bench.seeds:
            run = bench.run_dir(v, s, runs_root)
            if (run / "train.json").exists():
                summary = read_json(run / "train.json")
                train_s += float(summary.get("train_seconds") or 0.0)
                epoch_s = median_epoch_seconds(run)
                median_s += (epoch_s * int(summary.get("epochs_trained") or 0) if epoch_s is not None
                             else float(summary.get("train_seconds") or 0.0))
            if (run / "config.yaml").exists():
                starts.append((run / "config.yaml").stat().st_mtime)
            res = bench.result_path(v, s, results_root)
            if res.exists():
                ends.append(res.stat().st_mtime)
    wall = (max(ends) - min(starts)) if starts and ends else float("nan")
    return {"train_minutes_sum": train_s / 60, "median_minutes_sum": median_s / 60, "wall_minutes": wall / 60,
            "runs": len(starts)}


def split_description(dataset: str, config_dir: str | os.PathLike = "config") -> str:
    """Which split a table's numbers are from: the dataset's test split and, for a generated dataset, the seed its
    test images came from (``the synth test split, test images from seed 20261207``)."""
    from xmr.config.loader import load_dataset_config

    if not (Path(config_dir) / "datasets" / f"{dataset}.yaml").exists():
        return f"the {dataset} test split"
    ds = load_dataset_config(dataset, config_dir)
    gen = ds.get("generate") or {}
    seed = gen.get("test_seed", gen.get("seed")) if gen else None
    where = "" if seed is None else f", test images from seed {seed}" + \
        ("" if "test_seed" in gen else " (drawn after the training and validation images)")
    return f"the {dataset} {ds.get('test_split', 'test')} split{where}"


def dataset_stats(bench: Benchmark) -> dict | None:
    """``xmr synth --stats`` of the benchmark's dataset when it is generated (synth), else None."""
    from xmr.config.loader import load_dataset_config

    if not (bench.config_dir / "datasets" / f"{bench.dataset}.yaml").exists():
        return None
    ds = load_dataset_config(bench.dataset, bench.config_dir)
    if "generate" not in ds or not Path(ds["annotations"]).exists():
        return None
    from xmr.data.synth import synth_stats

    return synth_stats(ds["annotations"], batches=100)


def benchmark_markdown(bench: Benchmark, rows: list[dict], claims: list[dict], times: dict,
                       stats: dict | None = None, missing: list[str] = (), training: list[dict] = ()) -> str:
    out = io.StringIO()
    out.write(f"Measured on {split_description(bench.dataset, bench.config_dir)}.\n\n")
    if stats:
        test = stats["splits"].get("test", {})
        out.write(f"Dataset ({stats['file']}, style {stats['style']}): false_negative_rate_b128 "
                  f"{stats['false_negative_rate_b128']:.3f} (`xmr synth --stats`); test split {test.get('images')} "
                  f"images / {test.get('captions')} captions, subset `ambiguous` {test.get('ambiguous_images')} "
                  f"images / {test.get('ambiguous_captions')} captions.\n\n")
    n = len(bench.seeds)
    subsets = list(dict.fromkeys(r["subset"] for r in rows))
    heads = ["i2t R@1", "i2t R@5", "i2t R@10", "t2i R@1", "t2i R@5", "t2i R@10", "RSUM", "i2t mAP@R (ext.)",
             "t2i mAP@R (ext.)"]
    for subset in subsets:
        title = "whole test split" if subset == ALL else f"subset `{subset}`"
        out.write(f"**{bench.dataset} test, {title}, no re-ranking** (mean ± std over {n} seeds)\n\n")
        out.write("| variant | " + " | ".join(heads) + " |\n|---|" + "---|" * len(heads) + "\n")
        for r in rows:
            if r["subset"] == subset and r["rerank"] == PLAIN:
                out.write(f"| {r['variant']} | " + " | ".join(
                    _pm(r.get(f"{m}_mean", math.nan), r.get(f"{m}_std", math.nan)) for m in METRICS + EXTENDED_METRICS)
                    + " |\n")
        out.write("\n")
    others = [x for x in bench.rerank if x != PLAIN]
    if others:
        for subset in subsets:
            title = "whole test split" if subset == ALL else f"subset `{subset}`"
            out.write(f"**RSUM with each re-ranker, {title}** (mean ± std over {n} seeds)\n\n")
            out.write("| variant | none | " + " | ".join(others) + " |\n|---|" + "---|" * (len(others) + 1) + "\n")
            for v in bench.variants:
                cells = []
                for rr in [PLAIN] + others:
                    hit = [r for r in rows if r["variant"] == v and r["rerank"] == rr and r["subset"] == subset]
                    cells.append(_pm(hit[0]["rsum_mean"], hit[0]["rsum_std"]) if hit else "–")
                out.write(f"| {v} | " + " | ".join(cells) + " |\n")
            out.write("\n")
    if training:
        out.write(training_markdown(bench, list(training)))
    out.write("Variants: " + "; ".join(f"`{v}` = {bench.label(v)}" for v in bench.variants) + ".\n\n")
    if missing:
        out.write(f"**Incomplete: {len(missing)} of {len(bench.variants) * n} runs have no results yet** "
                  f"({', '.join(missing)}); their claims are marked *not run* and means use the seeds present.\n\n")
    out.write(time_line(bench, times))
    return out.getvalue()


def time_line(bench: Benchmark, times: dict) -> str:
    shared = (f"; the runs of {', '.join(f'`{v}`' for v in sorted(bench.shared))} are {bench.runs_from}'s, not "
              f"counted here" if bench.shared else "")
    own = len(bench.variants) - len(bench.shared)
    median = times.get("median_minutes_sum", times["train_minutes_sum"])
    return (f"{times['runs']} trainings ({own} variants × {len(bench.seeds)} seeds{shared}); "
            f"{times['train_minutes_sum']:.1f} min of training measured in all, {median:.1f} at each run's median "
            f"epoch time (*s / epoch*, *min / run*: a run paused, resumed or sharing the machine with other work "
            f"counts its stalls in the first figure only); wall time from the first training to the last evaluation "
            f"{times['wall_minutes']:.1f} min.\n")


def training_part(bench: Benchmark, training: list[dict], times: dict, missing: list[str] = ()) -> str:
    """The short page part: how each variant trained (epochs, ending, time, spread) and what the whole run took."""
    note = (f"**Incomplete: {len(missing)} runs have no results yet** ({', '.join(missing)}).\n\n"
            if missing else "")
    return (f"Measured on {split_description(bench.dataset, bench.config_dir)}.\n\n" + training_markdown(bench, training)
            + note + time_line(bench, times))


def plot_benchmark(bench: Benchmark, rows: list[dict], out_png: str | os.PathLike) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    subsets = list(dict.fromkeys(r["subset"] for r in rows))
    fig, axes = plt.subplots(1, len(subsets), figsize=(6 * len(subsets), 4.2), squeeze=False)
    names = list(bench.variants)
    shown = [x for x in (PLAIN, "fr") if x in bench.rerank]
    width = 0.8 / len(shown)
    for ax, subset in zip(axes[0], subsets):
        for k, rr in enumerate(shown):
            means, stds = [], []
            for v in names:
                hit = [r for r in rows if r["variant"] == v and r["rerank"] == rr and r["subset"] == subset]
                means.append(hit[0]["rsum_mean"] if hit else np.nan)
                stds.append(hit[0]["rsum_std"] if hit else 0.0)
            x = np.arange(len(names)) + (k - (len(shown) - 1) / 2) * width
            ax.bar(x, means, width, yerr=np.nan_to_num(stds), capsize=3, label="plain" if rr == PLAIN else rr)
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("RSUM (mean ± std over seeds)")
        ax.set_title(f"{bench.dataset}: {'whole test split' if subset == ALL else subset}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def validation_curves_label(histories: dict[str, list[list[dict[str, float]]]]) -> str:
    """The y-axis of :func:`plot_validation_curves`: a mean ± std only where some line stands for several runs."""
    runs = max((len(v) for v in histories.values()), default=0)
    return "validation RSUM (mean ± std over seeds)" if runs > 1 else "validation RSUM (one run per line)"


def plot_validation_curves(histories: dict[str, list[list[dict[str, float]]]], out_png: str | os.PathLike,
                           title: str) -> None:
    """Validation RSUM per epoch of each variant's seeds: the mean over the runs that reached an epoch, with a
    ± std band where two or more did; a run that stopped earlier ends its contribution there. The legend gives
    each line's number of runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for name, runs in histories.items():
        by_epoch: dict[float, list[float]] = {}
        for rows in runs:
            for r in rows:
                if "val_rsum" in r:
                    by_epoch.setdefault(r["epoch"], []).append(r["val_rsum"])
        if not by_epoch:
            continue
        epochs = sorted(by_epoch)
        mean = np.array([np.mean(by_epoch[e]) for e in epochs])
        std = np.array([np.std(by_epoch[e], ddof=1) if len(by_epoch[e]) > 1 else 0.0 for e in epochs])
        line, = ax.plot(epochs, mean, marker=".", markersize=3, label=f"{name} ({len(runs)})")
        ax.fill_between(epochs, mean - std, mean + std, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("epoch")
    ax.set_ylabel(validation_curves_label(histories))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, ncol=2)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100, format="png")
    plt.close(fig)


def write_benchmark(bench: Benchmark, out_dir: str | os.PathLike | None = None,
                    results_root: str | os.PathLike = RESULTS_ROOT, runs_root: str | os.PathLike = RUNS_ROOT,
                    strict: bool = True) -> dict[str, Path]:
    """Write ``{name}.md/.csv/.json/.png``, ``{name}_curves.png``, ``{name}_claims.md/.csv`` and ``{name}_training.md``
    (atomically) and return their paths. ``strict=False`` writes what exists: missing runs are listed and their claims marked *not run*."""
    from xmr.core.io import atomic_path, write_json

    differences = check_trained_alike(bench)
    out = Path(out_dir or results_dir(bench.dataset, results_root))
    out.mkdir(parents=True, exist_ok=True)
    records = gather(bench, results_root, strict)
    rows = summary_rows(bench, records)
    claims = judge_claims(bench, records, differences, results_root)
    times = timing(bench, runs_root, results_root)
    stats = dataset_stats(bench)
    training = gather_training(bench, results_root, runs_root)
    paths = {k: out / f"{bench.name}{suffix}" for k, suffix in
             (("md", ".md"), ("csv", ".csv"), ("json", ".json"), ("png", ".png"), ("claims_md", "_claims.md"),
              ("claims_csv", "_claims.csv"), ("curves_png", "_curves.png"), ("training_md", "_training.md"))}
    present = {(r["variant"], r["seed"]) for r in records}
    missing = [f"{v}/s{sd}" for v in bench.variants for sd in bench.seeds if (v, sd) not in present]
    for key, text in (("md", benchmark_markdown(bench, rows, claims, times, stats, missing, training)),
                      ("claims_md", claims_markdown(claims, len(bench.seeds), bench, differences,
                                                    split_description(bench.dataset, bench.config_dir))),
                      ("training_md", training_part(bench, training, times, missing)),
                      ("csv", _csv(records)), ("claims_csv", _csv(claims))):
        with atomic_path(paths[key], ".tmp") as tmp:
            tmp.write_text(text)
    write_json(paths["json"], {"benchmark": bench.name, "dataset": bench.dataset, "seeds": bench.seeds,
                               "summary": rows, "claims": claims, "timing": times, "dataset_stats": stats,
                               "training": training, "degenerate_std": bench.degenerate_std})
    with atomic_path(paths["png"], ".png") as tmp:
        plot_benchmark(bench, rows, tmp)
    with atomic_path(paths["curves_png"], ".png") as tmp:
        plot_validation_curves(run_histories(bench, runs_root), tmp,
                               f"{bench.dataset}: validation RSUM per epoch (mean ± std over seeds)")
    return paths


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    if rows:
        w = csv.DictWriter(out, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return out.getvalue()


__all__ = ["Benchmark", "benchmark_names", "load_benchmark", "benchmark_path", "gather", "summary_rows", "judge_claims", "compare",
           "t_test", "holm", "verdict", "gather_training", "run_histories", "mean_std", "write_benchmark", "flat_metrics",
           "validation_curves_label"]
