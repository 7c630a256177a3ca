"""Statistics over seeds (the seeded benchmark's claims, xmr/studies/benchmark.py): mean and standard deviation, paired
or Welch t tests (two-sided or one-sided), Holm's step-down adjustment and the level of each of its steps, one-sided
confidence bounds, the minimum detectable effect, non-superiority and equivalence (TOST) tests, the exact
permutation test over seeds (no normality assumed) and the stratified cluster bootstrap of query-level
differences. Pure functions of numbers."""

from __future__ import annotations

import math

import numpy as np


def mean_std(values) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; NaN for one value)."""
    v = np.asarray(list(values), dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan")


def compare(better: dict[int, float], worse: dict[int, float], paired: bool) -> dict[str, float]:
    """Difference of means, its standard error, the t statistic, its degrees of freedom, the two-sided p and the
    one-sided p of the claimed direction (``p_greater``, H1: better > worse): paired over common seeds (df = n - 1),
    else Welch's (Welch-Satterthwaite df)."""
    if paired:
        seeds = sorted(set(better) & set(worse))
        d = np.asarray([better[s] - worse[s] for s in seeds])
        diff = float(d.mean())
        se = float(d.std(ddof=1) / math.sqrt(d.size)) if d.size > 1 else float("nan")
        df = float(d.size - 1) if d.size > 1 else float("nan")
        return {"diff": diff, "se": se, "n": int(d.size), **t_test(diff, se, df)}
    b, w = np.asarray(list(better.values())), np.asarray(list(worse.values()))
    diff = float(b.mean() - w.mean())
    if min(b.size, w.size) > 1:
        vb, vw = b.var(ddof=1) / b.size, w.var(ddof=1) / w.size
        se = float(math.sqrt(vb + vw))
        den = vb ** 2 / (b.size - 1) + vw ** 2 / (w.size - 1)
        df = float((vb + vw) ** 2 / den) if den > 0 else float(b.size + w.size - 2)
    else:
        se = df = float("nan")
    return {"diff": diff, "se": se, "n": int(min(b.size, w.size)), **t_test(diff, se, df)}


def t_test(diff: float, se: float, df: float) -> dict[str, float]:
    """``t = diff / se``, its two-sided p and its one-sided p against ``diff <= 0`` (``p_greater``) under
    Student's t with ``df`` degrees of freedom (the normality of the per-seed values is assumed). A zero SE (the
    same numbers on every seed) makes any non-zero difference exact (p = 0)."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df)):
        return {"t": float("nan"), "df": df, "p": float("nan"), "p_greater": float("nan")}
    if se == 0:
        return {"t": math.copysign(math.inf, diff) if diff else 0.0, "df": df, "p": 0.0 if diff else 1.0,
                "p_greater": 0.0 if diff > 0 else 1.0}
    t = diff / se
    return {"t": t, "df": df, "p": float(2 * stats.t.sf(abs(t), df)), "p_greater": float(stats.t.sf(t, df))}


def non_superiority_p(diff: float, se: float, df: float, margin: float) -> float:
    """One-sided test of H0: true difference >= ``margin`` against H1: it is smaller (a gain as large as the margin
    is ruled out; the claimed direction is > 0). Small p: no effect >= ``margin`` in the claimed direction."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df) and math.isfinite(margin)):
        return float("nan")
    if se == 0:
        return 0.0 if diff < margin else 1.0
    return float(stats.t.cdf((diff - margin) / se, df))


def one_sided_bound(diff: float, se: float, df: float, level: float, side: str) -> float:
    """The one-sided confidence bound at ``level`` (e.g. 0.95): ``lower`` = diff - t_{level, df} se, ``upper`` =
    diff + t_{level, df} se (NaN where the t test has no SE or df)."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df)) or not 0 < level < 1:
        return float("nan")
    half = float(stats.t.ppf(level, df)) * se
    return diff - half if side == "lower" else diff + half


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p values (NaN stays NaN and does not count in the family): the i-th smallest
    of m p values becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    m, out, running = len(finite), [float("nan")] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def holm_levels(pvalues: list[float], alpha: float) -> list[float]:
    """The level Holm's step-down rule compares each p value with: the i-th smallest of the m finite p values
    (i = 1..m) against alpha / (m - i + 1); NaN for a NaN p. (A p below its level is rejected only if every smaller
    p of the family was too.)"""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    out = [float("nan")] * len(pvalues)
    for rank, (_, i) in enumerate(finite):
        out[i] = alpha / (len(finite) - rank)
    return out


def permutation_p(better: dict[int, float], worse: dict[int, float], paired: bool, shift: float = 0.0,
                  alternative: str = "greater", max_exact: int = 200_000, resamples: int = 20_000,
                  seed: int = 0) -> dict[str, float]:
    """A test over seeds that does not assume normality: the difference of means of ``better - shift`` and
    ``worse`` against its permutation distribution, exactly (paired: every sign flip of the per-seed differences
    over common seeds, 2^n; independent: every split of the pooled values into groups of the two sizes) or, past
    ``max_exact`` permutations, from ``resamples`` random ones. ``alternative``: ``greater`` (H1: the difference
    exceeds ``shift``) or ``less``. Returns ``p`` and ``p_min``, the smallest p the design can give (3 paired
    seeds: 1/8; 3 against 3: 1/20)."""
    from itertools import combinations, product

    sign = 1.0 if alternative == "greater" else -1.0
    if paired:
        seeds = sorted(set(better) & set(worse))
        d = np.asarray([better[s] - shift - worse[s] for s in seeds])
        observed = sign * d.mean() if d.size else float("nan")
        if d.size == 0:
            return {"p": float("nan"), "p_min": float("nan")}
        if 2 ** d.size <= max_exact:
            signs = np.asarray(list(product((1.0, -1.0), repeat=d.size)))
        else:
            signs = np.random.default_rng(seed).choice((1.0, -1.0), size=(resamples, d.size))
        stats_ = sign * (signs * np.abs(d)).mean(1)
        p_min = 1.0 / len(stats_) if 2 ** d.size <= max_exact else 1.0 / (resamples + 1)
    else:
        b = np.asarray(list(better.values()), dtype=np.float64) - shift
        w = np.asarray(list(worse.values()), dtype=np.float64)
        if not b.size or not w.size:
            return {"p": float("nan"), "p_min": float("nan")}
        pooled, nb = np.concatenate([b, w]), b.size
        observed = sign * (b.mean() - w.mean())
        if math.comb(pooled.size, nb) <= max_exact:
            picks = [np.asarray(c) for c in combinations(range(pooled.size), nb)]
        else:
            rng = np.random.default_rng(seed)
            picks = [rng.permutation(pooled.size)[:nb] for _ in range(resamples)]
        total = pooled.sum()
        stats_ = np.asarray([sign * (pooled[c].sum() / nb - (total - pooled[c].sum()) / (pooled.size - nb))
                             for c in picks])
        p_min = 1.0 / len(stats_) if math.comb(pooled.size, nb) <= max_exact else 1.0 / (resamples + 1)
    exact = p_min == 1.0 / len(stats_)
    hits = int(np.sum(stats_ >= observed - 1e-9 * max(1.0, abs(observed))))
    p = hits / len(stats_) if exact else (hits + 1) / (len(stats_) + 1)
    return {"p": float(p), "p_min": float(p_min)}


def confidence_interval(diff: float, se: float, df: float, level: float = 0.95) -> tuple[float, float]:
    """``diff ± t_{(1+level)/2, df} · se`` (NaN where the t test has no SE or df)."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df)):
        return float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return diff - half, diff + half


def detectable_effect(se: float, df: float, alpha: float, power: float = 0.8, sides: int = 2) -> float:
    """The smallest true difference that a t test at level ``alpha`` (``sides`` 2: two-sided; 1: one-sided in the
    difference's direction) detects with probability ``power``, given the standard error ``se`` at ``df`` degrees
    of freedom (the noncentral t: the design's minimum detectable effect, computed from the spread observed)."""
    from scipy import optimize, stats

    if not (math.isfinite(se) and math.isfinite(df)) or df <= 0:
        return float("nan")
    if se == 0:
        return 0.0
    crit = float(stats.t.ppf(1 - alpha / sides, df))

    def shortfall(delta: float) -> float:
        nc = delta / se
        # two-sided: rejecting in the other direction counts too (tiny; NaN underflows)
        wrong_side = float(stats.nct.cdf(-crit, df, nc)) if sides == 2 else 0.0
        return float(stats.nct.sf(crit, df, nc)) + (wrong_side if math.isfinite(wrong_side) else 0.0) - power

    hi = se * (crit + 10.0)
    while shortfall(hi) < 0:
        hi *= 2
    return float(optimize.brentq(shortfall, 0.0, hi, xtol=1e-9 * se))


def equivalence_p(diff: float, se: float, df: float, margin: float) -> float:
    """Two one-sided tests (TOST) of ``|true difference| < margin``: the larger of the two one-sided p values
    (H0: difference <= -margin; H0: difference >= +margin). Small p: no effect as large as ``margin``."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df) and math.isfinite(margin)) or margin <= 0:
        return float("nan")
    if se == 0:
        return 0.0 if abs(diff) < margin else 1.0
    lower = float(stats.t.sf((diff + margin) / se, df))
    upper = float(stats.t.cdf((diff - margin) / se, df))
    return max(lower, upper)


def cluster_bootstrap(per_stratum: list[np.ndarray], resamples: int = 2000, seed: int = 0,
                      level: float = 0.95) -> dict[str, float]:
    """Paired query-level comparison: ``per_stratum[s][c]`` is cluster c's contribution to the difference in stratum
    s (a seed; a cluster = one image with its captions, which are not independent queries). The statistic is the
    mean over strata of each stratum's sum; each resample draws every stratum's clusters with replacement, within
    the stratum. Returns the statistic, the bootstrap SE, the percentile interval and the two-sided normal p."""
    from scipy import stats

    diffs = [np.asarray(d, dtype=np.float64) for d in per_stratum if len(d)]
    if not diffs:
        nan = float("nan")
        return {"diff": nan, "se": nan, "ci_low": nan, "ci_high": nan, "p": nan, "resamples": 0}
    rng = np.random.default_rng(seed)
    total = np.zeros(resamples)
    for d in diffs:
        counts = rng.multinomial(d.size, np.full(d.size, 1.0 / d.size), size=resamples)  # (resamples, clusters)
        total += counts @ d
    boot = total / len(diffs)
    stat = float(np.mean([d.sum() for d in diffs]))
    se = float(boot.std(ddof=1))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    p = float(2 * stats.norm.sf(abs(stat) / se)) if se > 0 else (0.0 if stat else 1.0)
    return {"diff": stat, "se": se, "ci_low": float(lo), "ci_high": float(hi), "p": p, "resamples": resamples}
