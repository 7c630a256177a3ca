"""Statistics over seeds (the seeded benchmark's claims, xmr/benchmark.py): mean and standard deviation, paired or
Welch t tests, Holm's step-down adjustment. Pure functions of numbers."""

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
    """Difference of means, its standard error, the t statistic, its degrees of freedom and the two-sided p:
    paired over common seeds (df = n - 1), else Welch's (Welch-Satterthwaite df)."""
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
    """``t = diff / se`` and its two-sided p under Student's t with ``df`` degrees of freedom. A zero SE (the
    same numbers on every seed) makes any non-zero difference exact (p = 0)."""
    from scipy import stats

    if not (math.isfinite(se) and math.isfinite(df)):
        return {"t": float("nan"), "df": df, "p": float("nan")}
    if se == 0:
        return {"t": math.copysign(math.inf, diff) if diff else 0.0, "df": df, "p": 0.0 if diff else 1.0}
    t = diff / se
    return {"t": t, "df": df, "p": float(2 * stats.t.sf(abs(t), df))}


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p values (NaN stays NaN and does not count in the family): the i-th smallest
    of m p values becomes max over j <= i of min(1, (m - j + 1) p_(j))."""
    finite = sorted((p, i) for i, p in enumerate(pvalues) if math.isfinite(p))
    m, out, running = len(finite), [float("nan")] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(finite):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
