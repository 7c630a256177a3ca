"""Judging a seeded benchmark's claims (docs/benchmark.md "Verdicts"): one row per claim of
``config/benchmark/{name}.yaml`` with its difference, its tests and a verdict scoped to the dataset it was measured on.

- **Directional tests.** Every claim says one side is better, so its test is one-sided in the claimed direction:
  *holds* when H0 "difference <= 0" is rejected. A gain as large as the smallest effect of interest Δ is ruled out by
  the one-sided non-superiority test of H0 "difference >= Δ": *no effect ≥ Δ*, or *reversed* when the same upper
  bound is below 0. Neither: *underpowered*. The t tests assume the per-seed values are normal; beside them, an
  exact permutation test over seeds assumes nothing of the kind, and a row whose two decisions differ is marked.
- **Families.** Holm's step-down rule runs over one family of claims (one per paper; xmr's extensions of a paper's
  sentence form a family of their own) across every benchmark file of the folder: a family split over files is
  adjusted as one (:func:`joint_family_rows`). A claim of the family whose runs are missing counts at p = 1.
- **Query level.** A claim on the same trained models (a re-ranker against plain) has beside its seed-level test
  a paired bootstrap over the test queries, resampled by image cluster within each seed (:func:`query_level`).
- **Levels.** The bounds printed beside each difference are at the level Holm's rule tested that row at (its step,
  alpha / (m - i + 1)); the unadjusted 90 % interval (two one-sided 95 % bounds) is in the CSV and the legend.
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import numpy as np

from xmr.core.errors import XmrError
from xmr.evaluation.stats import (compare, confidence_interval, detectable_effect, holm, holm_levels, mean_std,
                                  non_superiority_p, one_sided_bound, permutation_p)
from xmr.run.layout import RESULTS_ROOT
from xmr.studies.benchmark_config import (ALL, LOWER_IS_BETTER, SET_METRICS, Benchmark, _short, _side, _values,
                                          differs_text, gather, load_benchmark)
from xmr.studies.benchmark_config import (CONTRIBUTION, RECIPE, add_contribution_claims,  # noqa: F401 - importable
                                          contribution_settings, contribution_variant_name)  # here, as documented

ALPHA = 0.05  # one-sided, family-wise over each family's claims (Holm)
#: the four verdicts; a claim whose runs are missing reads "not run", one whose metric a run lacks "not measured"
HOLDS, REVERSED, NO_EFFECT, UNDERPOWERED = "holds", "reversed", "no effect ≥ Δ", "underpowered"
UNJUDGED = ("not run", "not measured")
STATED, EXTENSION = "stated", "extension"


def verdict(diff: float, p_adjusted: float, p_non_superiority_adjusted: float = float("nan"),
            alpha: float = ALPHA, upper: float = float("nan"), scope: str = "") -> str:
    """*holds*: the (Holm-adjusted) one-sided p of the claimed direction is below ``alpha``; else, when the
    (Holm-adjusted) non-superiority test rejects a gain as large as Δ, *reversed* if the upper bound at that test's
    level is below 0 and *no effect ≥ Δ* otherwise; else *underpowered* (the row's detectable effect says at what
    size this design would decide). ``scope`` (the dataset, e.g. ``synth``) is appended: ``holds on synth``."""
    if math.isfinite(p_adjusted) and p_adjusted < alpha and diff > 0:
        label = HOLDS
    elif math.isfinite(p_non_superiority_adjusted) and p_non_superiority_adjusted < alpha:
        label = REVERSED if math.isfinite(upper) and upper < 0 else NO_EFFECT
    else:
        label = UNDERPOWERED
    return f"{label} on {scope}" if scope else label


def decision(p_adjusted: float, p_non_superiority_adjusted: float, alpha: float = ALPHA) -> str:
    """What a pair of adjusted p values decides: ``gain`` (superiority), ``no gain ≥ Δ`` or ``undecided``."""
    if math.isfinite(p_adjusted) and p_adjusted < alpha:
        return "gain"
    if math.isfinite(p_non_superiority_adjusted) and p_non_superiority_adjusted < alpha:
        return "no gain ≥ Δ"
    return "undecided"


def claim_kind(claim: dict) -> str:
    """``extension`` for a claim that extends a paper's sentence (its ``extends:``), else ``stated``."""
    return EXTENSION if claim.get("extends") else STATED


def _unjudged(c: dict, subset: str, metric: str, paired: bool, why: str) -> dict:
    nan = float("nan")
    return {"claim": c["claim"], "judged": c.get("judged", ""), "source": c["source"],
            "extends": c.get("extends", ""), "kind": claim_kind(c), "family": c["family"], "better": c["better"], "worse": c["worse"], "subset": subset, "metric": metric,
            "better_mean": nan, "better_std": nan, "worse_mean": nan, "worse_std": nan, "diff": nan, "se": nan,
            "n": 0, "t": nan, "df": nan, "p": nan, "paired": paired, "verdict": why, "differs": "",
            "differs_keys": ""}


def claim_rows(bench: Benchmark, records: list[dict], differences: dict | None = None, results_root=None,
               query: bool = True, missing_ok: bool = False) -> list[dict]:
    """One unadjusted row per claim of ``bench``: both sides' mean ± std, the difference (> 0: as claimed), the
    t tests (one-sided p of the claimed direction, two-sided p, non-superiority p at Δ), the permutation tests,
    the unadjusted 90 % interval and, for claims on the same models, the query-level test. ``missing_ok``: a claim
    with no results at all reads *not run* (another file's claims of a joint family)."""
    results_root = RESULTS_ROOT if results_root is None else results_root
    differences = differences or {}
    rows = []
    for i, c in enumerate(bench.claims):
        (bv, br), (wv, wr) = _side(c["better"]), _side(c["worse"])
        subset, metric, paired = c["subset"], c["metric"], bv == wv
        declared = {"differs": differs_text(differences.get(i, [])),
                    "differs_keys": differs_text(differences.get(i, []), values=False)}
        b, w = _values(records, bv, br, subset, metric), _values(records, wv, wr, subset, metric)
        if metric in SET_METRICS or "." in metric:  # a run without the metric (set statistics, extended metrics)
            measured = {v: {s: x for s, x in side.items() if math.isfinite(x)} for v, side in (("b", b), ("w", w))}
            if (b and w) and not (measured["b"] and measured["w"]):
                rows.append({**_unjudged(c, subset, metric, paired, "not measured"), **declared})
                continue
            b, w = measured["b"], measured["w"]
        if not b or not w:
            if missing_ok or any(r["subset"] == subset for r in records):  # the subset exists: runs are missing
                rows.append({**_unjudged(c, subset, metric, paired, "not run"), **declared})
                continue
            raise XmrError(f"{bench.path}: claim {c['claim']!r}: no results for subset {subset!r}; does the dataset "
                           f"define that evaluation subset?")
        # > 0 always means "as claimed": for a lower-is-better metric the claimed-better side is the lower one
        hi, lo = (w, b) if metric in LOWER_IS_BETTER else (b, w)
        cmp = compare(hi, lo, paired=paired)
        (bm, bs), (wm, ws) = mean_std(b.values()), mean_std(w.values())
        sesoi = bench.smallest_effect[metric]
        low90, high90 = confidence_interval(cmp["diff"], cmp["se"], cmp["df"], level=1 - 2 * ALPHA)
        perm = permutation_p(hi, lo, paired)
        perm_ns = permutation_p(hi, lo, paired, shift=sesoi, alternative="less")
        row = {"claim": c["claim"], "judged": c.get("judged", ""), "source": c["source"],
               "extends": c.get("extends", ""), "kind": claim_kind(c),
               "family": c["family"], "better": c["better"], "worse": c["worse"], "subset": subset,
               "metric": metric, "better_mean": bm, "better_std": bs, "worse_mean": wm, "worse_std": ws,
               "diff": cmp["diff"], "se": cmp["se"], "n": cmp["n"], "t": cmp["t"], "df": cmp["df"],
               "p": cmp["p_greater"], "p_two_sided": cmp["p"], "ci_low": low90, "ci_high": high90,
               "paired": paired, "smallest_effect": sesoi,
               "p_non_superiority": non_superiority_p(cmp["diff"], cmp["se"], cmp["df"], sesoi),
               "perm_p": perm["p"], "perm_p_non_superiority": perm_ns["p"], "perm_p_min": perm["p_min"],
               **declared}
        if query and paired and metric in QUERY_CUTOFFS:
            seeds = sorted(set(b) & set(w))
            row.update({f"query_{k}": v for k, v in query_level(bench, c, seeds, results_root).items()})
        rows.append(row)
    for row in rows:
        row["file"] = bench.name
    return rows


def joint_family_benchmarks(bench: Benchmark) -> list[Benchmark]:
    """The other benchmark files beside ``bench`` (same folder, same dataset) with a claim in one of its families."""
    families = {c["family"] for c in bench.claims}
    out = []
    for path in sorted(Path(bench.path).parent.glob("*.yaml")):
        if path.stem == bench.name:
            continue
        other = load_benchmark(path, bench.config_dir)
        if other.dataset == bench.dataset and any(c["family"] in families for c in other.claims):
            out.append(other)
    return out


def joint_family_rows(bench: Benchmark, results_root=None) -> list[dict]:
    """Unadjusted rows of the claims of :func:`joint_family_benchmarks` in ``bench``'s families: Holm's rule
    adjusts a family as one across the files. Their runs may be missing (*not run*: counted at p = 1)."""
    families = {c["family"] for c in bench.claims}
    out = []
    for other in joint_family_benchmarks(bench):
        records = gather(other, results_root, strict=False) if results_root is not None else \
            gather(other, strict=False)
        out += [r for r in claim_rows(other, records, {}, results_root, query=False, missing_ok=True)
                if r["family"] in families]
    return out


def adjust_families(rows: list[dict], power: float = 0.8, scope: str = "", alpha: float = ALPHA) -> list[dict]:
    """Holm's step-down rule over each family (every row of ``rows`` with that ``family``, whatever its file), for
    the superiority and the non-superiority tests, t and permutation alike; each row's bounds at the level of its
    Holm step, its one-sided detectable effect at alpha / m, its verdict and whether the permutation test decides
    the same. A row *not run* counts at p = 1 (the family keeps its declared size); *not measured* does not count."""
    for family in dict.fromkeys(r["family"] for r in rows):
        members = [r for r in rows if r["family"] == family]
        kinds = {r["kind"] for r in members}
        if len(kinds) > 1:
            files = sorted({f"{r['file']}: {r['claim']}" for r in members if r["kind"] == EXTENSION})
            raise XmrError(f"family {family!r} mixes a paper's stated claims with xmr's extensions ({files[0]}, ...); "
                           f"give the extensions (claims with `extends:`) a family of their own")

        def column(key: str) -> list[float]:
            return [1.0 if r.get("verdict") == "not run" else r.get(key, float("nan")) for r in members]

        size = sum(r.get("verdict") == "not run" or math.isfinite(r["p"]) for r in members)
        not_run = sum(r.get("verdict") == "not run" for r in members)
        files = sorted({r["file"] for r in members})
        adjusted = {key: holm(column(key)) for key in ("p", "p_non_superiority", "perm_p", "perm_p_non_superiority")}
        levels = {key: holm_levels(column(key), alpha) for key in ("p", "p_non_superiority")}
        for k, row in enumerate(members):
            row.update({"p_holm": adjusted["p"][k], "p_non_superiority_holm": adjusted["p_non_superiority"][k],
                        "perm_p_holm": adjusted["perm_p"][k],
                        "perm_p_non_superiority_holm": adjusted["perm_p_non_superiority"][k],
                        "family_size": size, "family_not_run": not_run, "family_files": " ".join(files)})
            if row.get("verdict") in UNJUDGED:
                continue
            row["alpha"] = alpha / max(size, 1)
            row["level_low"], row["level_high"] = levels["p"][k], levels["p_non_superiority"][k]
            row["bound_low"] = one_sided_bound(row["diff"], row["se"], row["df"], 1 - row["level_low"], "lower")
            row["bound_high"] = one_sided_bound(row["diff"], row["se"], row["df"], 1 - row["level_high"], "upper")
            row["detectable"] = detectable_effect(row["se"], row["df"], row["alpha"], power, sides=1)
            row["verdict"] = verdict(row["diff"], row["p_holm"], row["p_non_superiority_holm"], alpha,
                                     row["bound_high"], scope)
            row["decision_t"] = decision(row["p_holm"], row["p_non_superiority_holm"], alpha)
            row["decision_permutation"] = decision(row["perm_p_holm"], row["perm_p_non_superiority_holm"], alpha)
            row["tests_disagree"] = row["decision_t"] != row["decision_permutation"]
    return rows


def judge_claims(bench: Benchmark, records: list[dict], differences: dict | None = None, results_root=None,
                 joint: bool = True) -> list[dict]:
    """One row per claim of ``bench`` (:func:`claim_rows`), adjusted within each family across every benchmark file
    beside it (``joint``; :func:`joint_family_rows`), with its verdict scoped to the dataset."""
    own = claim_rows(bench, records, differences, results_root)
    others = joint_family_rows(bench, results_root) if joint else []
    adjust_families(own + others, bench.power, bench.dataset)
    columns = list(dict.fromkeys(k for r in own for k in r))  # one set of columns (the CSV): NaN where none
    return [{k: r.get(k, float("nan")) for k in columns} for r in own]


# --------------------------------------------------------------------------------------------------- query level
def ranks_path(result_path: str | os.PathLike) -> Path:
    """The per-query ranks written beside a results file (``s0.json`` -> ``s0.ranks.npz``)."""
    return Path(result_path).with_suffix(".ranks.npz")


#: per metric, the recall cut-offs each direction adds up (RSUM: all six)
QUERY_CUTOFFS = {"rsum": ((1, 5, 10), (1, 5, 10)), "i2t_r1": ((1,), ()), "t2i_r1": ((), (1,))}


def query_differences(ranks: dict[str, np.ndarray], better: str, worse: str, subset: str = ALL,
                      metric: str = "rsum") -> np.ndarray:
    """Per image cluster (an image with its captions), its contribution to ``metric``(better) - ``metric``(worse)
    of one trained model under two re-rankers, from the per-query ranks (:func:`xmr.run.results.write_query_ranks`);
    the contributions add up to the metric's difference. Clusters with no query in ``subset`` are left out."""
    i2t_k, t2i_k = QUERY_CUTOFFS[metric]
    c = int(ranks["captions_per_image"])
    bi, wi, bt, wt = (ranks[f"{r}/{d}"] for d in ("i2t", "t2i") for r in (better, worse))
    n, m = bi.size, bt.size
    im = ranks[f"subset/{subset}/images"] if subset != ALL else np.ones(n, bool)
    cm = ranks[f"subset/{subset}/captions"] if subset != ALL else np.ones(m, bool)

    def hits(r: np.ndarray, ks: tuple[int, ...]) -> np.ndarray:
        return sum((r < k).astype(np.float64) for k in ks) if ks else np.zeros(r.size)

    per_image = np.where(im, 100.0 * (hits(bi, i2t_k) - hits(wi, i2t_k)) / max(int(im.sum()), 1), 0.0)
    per_caption = np.where(cm, 100.0 * (hits(bt, t2i_k) - hits(wt, t2i_k)) / max(int(cm.sum()), 1), 0.0)
    owner = np.arange(m) // c
    d = per_image + np.bincount(owner, weights=per_caption, minlength=n)
    keep = im | (np.bincount(owner, weights=cm.astype(np.float64), minlength=n) > 0)
    return d[keep]


def query_level(bench: Benchmark, claim: dict, seeds: list[int],
                results_root: str | os.PathLike = RESULTS_ROOT) -> dict[str, float]:
    """The query-level paired test of a claim on the same trained models (a re-ranker against plain): the
    per-cluster differences of each seed's test queries, resampled by image cluster within each seed
    (:func:`xmr.evaluation.stats.cluster_bootstrap`). It answers: on this test set, do these trained models
    gain? (The seed-level test asks it of training runs in general.)"""
    from xmr.evaluation.stats import cluster_bootstrap
    from xmr.run.results import read_query_ranks

    (v, br), (_, wr) = _side(claim["better"]), _side(claim["worse"])
    per_seed = [query_differences(read_query_ranks(ranks_path(bench.result_path(v, s, results_root))), br, wr,
                                  claim["subset"], claim["metric"]) for s in seeds]
    return cluster_bootstrap(per_seed, bench.query_resamples, seed=0)


# ------------------------------------------------------------------------------------------------- the table
def _pm(m: float, s: float, digits: int = 1) -> str:
    if not math.isfinite(m):
        return "–"
    return f"{m:.{digits}f} ± {s:.{digits}f}" if math.isfinite(s) else f"{m:.{digits}f}"


def _seeds_note(n: int, n_seeds: int) -> str:
    return "" if n >= n_seeds else f" ({n} seeds)"


def _num(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def _p(p: float | None) -> str:
    if p is None or not isinstance(p, (int, float)) or not math.isfinite(p):
        return "–"
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def source_text(c: dict) -> str:
    """A stated claim's source (the paper and table); an extension's says so and quotes the sentence it extends."""
    if c.get("kind") == EXTENSION:
        return f"xmr's extension of {c['extends']}"
    return c["source"]


def claims_markdown(claims: list[dict], n_seeds: int, bench: Benchmark | None = None, differences: dict | None = None,
                    split: str = "") -> str:
    """The claims table, its legend (the tests, the families, Δ, the split) and the sources of the declared
    differences."""
    nan = float("nan")
    out = io.StringIO()
    scope = bench.dataset if bench else "the dataset"
    if split:
        out.write(f"Measured on {split}.\n\n")
    out.write("| claim | source | comparison | subset | claimed better | claimed worse | difference [bounds at the "
              "verdict's level] | t (df) | p one-sided (Holm) | detectable | verdict | permutation p (Holm) | "
              "query level [95 % CI] | what differs |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for c in claims:
        metric = "" if c["metric"] == "rsum" else \
            f" ({c['metric']}{', lower is better' if c['metric'] in LOWER_IS_BETTER else ''})"
        dg = 3 if c["metric"] in SET_METRICS else 1
        diff = "–" if not math.isfinite(c["diff"]) else \
            f"{c['diff']:+.{dg}f} [{_num(c.get('bound_low', nan), dg)}, {_num(c.get('bound_high', nan), dg)}]" \
            f"{' (paired)' if c['paired'] else ''}{_seeds_note(c['n'], n_seeds)}"
        t = "–" if not math.isfinite(c.get("df", nan)) else f"{c['t']:+.2f} ({c['df']:.1f})"
        found = c.get("detectable", nan)
        detect = "–" if not math.isfinite(found) else f"{found:.{dg}f}"
        query = "–" if not math.isfinite(c.get("query_diff", nan)) else \
            f"{c['query_diff']:+.1f} [{c['query_ci_low']:+.1f}, {c['query_ci_high']:+.1f}], p {_p(c['query_p'])}"
        perm = "–" if not math.isfinite(c.get("perm_p", nan)) else \
            f"{_p(c['perm_p_holm'])}{' ≠' if c.get('tests_disagree') is True else ''}"
        judged = f" ({c['judged']})" if c.get("judged") else ""
        out.write(f"| {c['claim']}{judged} | {source_text(c)} | `{c['better']}` vs `{c['worse']}`{metric} | {c['subset']} | "
                  f"{_pm(c['better_mean'], c['better_std'], dg)} | {_pm(c['worse_mean'], c['worse_std'], dg)} | "
                  f"{diff} | {t} | {_p(c.get('p_holm'))} | {detect} | **{c['verdict']}** | {perm} | {query} | "
                  f"{'same models' if c['paired'] else c.get('differs_keys') or 'nothing'} |\n")
    tested = [c for c in claims if math.isfinite(c.get("p", nan))]
    families: dict[str, tuple[int, str, int]] = {}
    for c in claims:
        if c["verdict"] != "not measured":
            families[c["family"]] = (int(c.get("family_size", 0) or 0), c.get("family_files", ""),
                                     int(c.get("family_not_run", 0) or 0))
    fams = ", ".join(f"{f} ({k}{', with ' + files.replace(' ', ', ') if ' ' in files else ''}"
                     f"{f'; {missing} not run' if missing else ''})" for f, (k, files, missing) in families.items())
    deltas = ", ".join(f"{k} {v:g}" for k, v in (bench.smallest_effect if bench else {}).items()
                       if any(c["metric"] == k for c in claims))
    power = bench.power if bench else 0.8
    raw = sum(c["p"] < ALPHA for c in tested)
    counts = {v: sum(str(c["verdict"]).startswith(v) for c in claims) for v in (HOLDS, REVERSED, NO_EFFECT,
                                                                                 UNDERPOWERED)}
    min_p = sorted({c["perm_p_min"] for c in tested if math.isfinite(c.get("perm_p_min", nan))})
    disagree = sum(c.get("tests_disagree") is True for c in claims)
    out.write(
        f"\nMean ± std over {n_seeds} seeds; every verdict is about {scope}, not about the paper's own datasets. "
        f"The difference is signed so that > 0 is the claimed direction (claimed worse − claimed better for a "
        f"lower-is-better metric). Seed level: one-sided t tests in the claimed direction, paired over seeds "
        f"(df = n − 1) when both sides are the same models, else Welch's (Welch–Satterthwaite df); they assume "
        f"the per-seed values are normal. *holds on {scope}*: Holm-adjusted one-sided p < {ALPHA} (H0: no gain); "
        f"*no effect ≥ Δ on {scope}*: the one-sided non-superiority test (H0: a gain ≥ Δ, Holm-adjusted) rejects; "
        f"*reversed on {scope}*: it rejects and the upper bound is below 0; *underpowered on {scope}*: neither. "
        f"Holm's step-down rule runs within each family, across every benchmark file that has claims of it: one "
        f"family per paper, and xmr's extensions of a paper's sentence (source \"xmr's extension of ...\") in a "
        f"family of their own ({fams}); a claim whose runs are missing counts at p = 1. The bounds beside the "
        f"difference are one-sided, each at the level Holm's rule tested it at: the lower one at the superiority "
        f"test's step (*holds* when it is above 0), the upper one at the non-superiority test's (*no effect ≥ Δ* "
        f"when it is below Δ, *reversed* below 0); a bound that clears its line in a row left undecided had a "
        f"smaller p of its family not pass first. The unadjusted 90 % interval (two one-sided 95 % bounds) is the "
        f"CSV's `ci_low`/`ci_high`. *Detectable*: the smallest true gain the one-sided test finds with "
        f"{power:.0%} power at {ALPHA} / the family's size (Holm's strictest step), given the spread observed. "
        f"Smallest effect of interest Δ: {deltas} (fixed before the runs, docs/benchmark.md \"Verdicts\"). "
        f"*Permutation p*: the exact permutation test over seeds of the same one-sided hypothesis, which does "
        f"not assume normality, Holm-adjusted alike; with these seeds its p cannot go below "
        f"{', '.join(f'{p:.3g}' for p in min_p) or '–'}; ≠ marks a row where it and the t test decide "
        f"differently ({disagree} rows). Verdicts: {', '.join(f'{k} {v}' for k, v in counts.items())}; "
        f"unadjusted, {raw} of {len(tested)} would pass one-sided p < {ALPHA}. *Query level* (claims on the same "
        f"models): the mean over seeds of the per-query difference summed over the test queries, its 95 % "
        f"interval and two-sided p from {bench.query_resamples if bench else 2000} bootstrap resamples of the "
        f"test images, each with its captions, within each seed: whether these trained models gain on this test "
        f"set. *What differs*: every setting on which the two sides' resolved run configs differ, each declared "
        f"(sources below); the protocol (batch, masking, stopping rule) is the same on both sides.\n")
    declared = sorted({(d.by, d.key, _short(d.value), d.source) for diffs in (differences or {}).values()
                       for d in diffs if d.by not in ("variant", "claim")})
    if declared:
        out.write("\nDeclared settings (config/method_settings.yaml): "
                  + "; ".join(f"{by} `{key}` {value}: {source}" for by, key, value, source in declared) + ".\n")
    return out.getvalue()


__all__ = ["ALPHA", "HOLDS", "REVERSED", "NO_EFFECT", "UNDERPOWERED", "verdict", "decision", "claim_rows",
           "joint_family_benchmarks", "joint_family_rows", "adjust_families", "judge_claims", "claims_markdown", "source_text",
           "query_differences", "query_level"]
