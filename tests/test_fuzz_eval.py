"""Fuzzing (docs/faults.md): `evaluate_sims` and `compute_similarity` (what `xmr evaluate` / `xmr similarity` call)
fed >= 1,000 seeded random inputs each: shapes, dtypes, values (ties, NaN/inf, huge), protocols, re-rankers with
random parameters, caption counts, tie policies. Only XmrError may escape; every result is in its valid range,
and re-ranker-free plain results equal a brute-force oracle of the documented tie policies."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from xmr.cli import main
from xmr.core.errors import XmrError
from xmr.evaluation import TIE_POLICIES, evaluate_sims
from xmr.rerank import RERANKERS
from xmr.similarity.measures import SIMILARITIES, compute_similarity

# all-negative random "cosines" are valid input that DSL/MR warn about (the warning is tested in test_pcme.py)
pytestmark = pytest.mark.filterwarnings("ignore:re-ranker .* every similarity is <= 0:UserWarning")

N_EVAL = int(os.environ.get("XMR_FUZZ_CASES", 1200))
N_SIM = int(os.environ.get("XMR_FUZZ_CASES", 1200))
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool", "complex64", "<U3", "object"]


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    kind = rng.choice(["normal", "ties", "constant", "huge", "tiny", "negative"])
    if kind == "normal":
        a = rng.standard_normal(shape)
    elif kind == "ties":  # few distinct values: every tie policy matters
        a = rng.integers(-2, 3, shape).astype(np.float64)
    elif kind == "constant":
        a = np.full(shape, rng.standard_normal())
    elif kind == "huge":
        a = rng.standard_normal(shape) * 1e30
    elif kind == "tiny":
        a = rng.standard_normal(shape) * 1e-30
    else:
        a = -np.abs(rng.standard_normal(shape)) - 0.1
    if a.size and rng.random() < 0.08:  # NaN / +-inf somewhere
        a.flat[rng.integers(a.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return a


def _cast(rng: np.random.Generator, a: np.ndarray) -> np.ndarray:
    dtype = DTYPES[0] if rng.random() < 0.6 else rng.choice(DTYPES)
    if dtype == "complex64":
        return a.astype(np.complex64) + 1j
    if dtype in ("<U3", "object"):
        return a.astype(dtype)
    with np.errstate(all="ignore"):
        return a.astype(dtype)


def _oracle_ranks(s: np.ndarray, c: int, ties: str) -> tuple[np.ndarray, np.ndarray]:
    """0-based first-relevant ranks by counting, straight from the policy definitions (ranks.py docstring)."""
    n, m = s.shape

    def first_rank(scores: np.ndarray, pos: np.ndarray) -> int:
        best = scores[pos].max()
        neg = np.ones(len(scores), bool)
        neg[pos] = False
        higher = int((scores > best).sum())
        if ties == "optimistic":
            return higher
        if ties == "pessimistic":
            return higher + int(((scores == best) & neg).sum())
        first = int(pos[scores[pos] == best].min())  # index: stable descending sort
        return higher + int(((scores == best) & neg)[:first].sum())

    i2t = np.array([first_rank(s[i], np.arange(c * i, c * i + c)) for i in range(n)])
    t2i = np.array([first_rank(s[:, j], np.array([j // c])) for j in range(m)])
    return i2t, t2i


def _check_direction(d: dict, gallery: int, class_level: bool) -> None:
    r = [d["r1"], d["r5"], d["r10"]]
    assert all(0.0 <= x <= 100.0 for x in r) and r[0] <= r[1] <= r[2], d
    if class_level:
        assert 0.0 <= d["r_precision"] <= 100.0, d
        return
    assert 1.0 <= d["medr"] <= gallery and 1.0 <= d["meanr"] <= gallery, (d, gallery)
    assert d["medr"] == math.floor(d["medr"])
    if gallery <= 1:
        assert r == [100.0, 100.0, 100.0]


def _random_rerank(rng: np.random.Generator) -> tuple[str | None, dict]:
    if rng.random() < 0.5:
        return None, {}
    name = str(rng.choice(RERANKERS.names()))
    params: dict = {}
    if rng.random() < 0.5:
        pick = {"csls": {"k": int(rng.integers(-1, 12))}, "isoftmax": {"beta": float(rng.choice([-1, 0, 0.5, 50]))},
                "dsl": {"scale": float(rng.choice([0, 1, 100, 1e4]))}, "qbnorm": {"self_bank": True,
                                                                                  "k": int(rng.integers(0, 4))},
                "rr": {"k_i2t": int(rng.integers(0, 20)), "k_t2i": int(rng.integers(0, 20))},
                "mr": {"k": int(rng.integers(0, 40))}, "fr": {"gamma1": float(rng.choice([0.1, 25, 1e3]))}}
        params = pick.get(name, {})
    if rng.random() < 0.05:
        params["no_such_param"] = 1
    return name, params


def _random_eval_case(rng: np.random.Generator) -> dict:
    n, c = int(rng.integers(1, 9)), int(rng.integers(1, 6))
    m = c * n if rng.random() < 0.85 else int(rng.integers(1, 30))
    shape: tuple[int, ...] = (n, m)
    u = rng.random()
    if u < 0.03:
        shape = (m,)
    elif u < 0.06:
        shape = (n, m, 1)
    elif u < 0.08:
        shape = (0, m)
    sims = _cast(rng, _values(rng, shape))
    protocol = str(rng.choice(["plain"] * 6 + ["cub", "cub", "f30k", "coco1k"]))
    kw: dict = {}
    if protocol == "cub":
        labels = rng.integers(0, max(1, n // 2) + 1, n if rng.random() < 0.9 else n + 1)
        kw["image_labels"] = labels if rng.random() < 0.9 else labels.astype(str)
    rerank, params = _random_rerank(rng)
    ties = str(rng.choice(list(TIE_POLICIES) + (["sideways"] if rng.random() < 0.05 else [])))
    cpi = c if rng.random() < 0.95 else int(rng.integers(-1, 2))
    return dict(sims=sims, protocol=protocol, captions_per_image=cpi, rerank=rerank, rerank_params=params,
                ties=ties, **kw)


def test_fuzz_evaluate_sims():
    rng = np.random.default_rng(20251125)
    outcomes = {"ok": 0, "error": 0, "oracle": 0}
    for case_no in range(N_EVAL):
        case = _random_eval_case(rng)
        try:
            m = evaluate_sims(**case)
        except XmrError as e:
            assert "\n" not in str(e), str(e)
            outcomes["error"] += 1
            continue
        except Exception as e:  # noqa: BLE001 - anything else is the bug being hunted
            summary = {k: (v.dtype, v.shape) if isinstance(v, np.ndarray) else v for k, v in case.items()}
            raise AssertionError(f"case {case_no}: {type(e).__name__}: {e} for {summary}") from e
        outcomes["ok"] += 1
        s = np.asarray(case["sims"])
        n, n_caps = s.shape
        assert (m["n_images"], m["n_captions"]) == (n, n_caps)
        cub = case["protocol"] == "cub"
        _check_direction(m["i2t"], n_caps, cub)
        _check_direction(m["t2i"], n, cub)
        if not cub:
            assert m["rsum"] == pytest.approx(sum(m[d][f"r{k}"] for d in ("i2t", "t2i") for k in (1, 5, 10)))
            assert 0.0 <= m["rsum"] <= 600.0
        if not cub and case["rerank"] is None:
            ref = s.astype(np.float32).astype(np.float64)  # what the evaluator ranks
            i2t, t2i = _oracle_ranks(ref, case["captions_per_image"], case["ties"])
            for d, ranks in (("i2t", i2t), ("t2i", t2i)):
                for k in (1, 5, 10):
                    assert m[d][f"r{k}"] == pytest.approx(100.0 * np.mean(ranks < k)), (case_no, d, k)
                assert m[d]["medr"] == np.floor(np.median(ranks)) + 1
                assert m[d]["meanr"] == pytest.approx(ranks.mean() + 1)
            outcomes["oracle"] += 1
    print(outcomes)
    # the generator must reach both outcomes and the oracle often, or the fuzzing tests little
    assert outcomes["ok"] > N_EVAL // 4 and outcomes["error"] > N_EVAL // 10 and outcomes["oracle"] > N_EVAL // 8, \
        outcomes


def _random_sim_case(rng: np.random.Generator) -> dict:
    n, m, d = int(rng.integers(0, 6)), int(rng.integers(0, 6)), int(rng.integers(1, 6))
    k, l = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    measure = "cosine" if rng.random() < 0.3 else str(rng.choice(SIMILARITIES.names()))
    if measure == "cosine" and rng.random() < 0.9:  # mostly valid single vectors, so the oracle runs often
        k = l = 1
    x_shape = (n, d) if (k == 1 and rng.random() < 0.5) else (n, k, d)
    y_shape = (m, d) if (l == 1 and rng.random() < 0.5) else (m, l, d)
    if rng.random() < 0.05:
        y_shape = y_shape[:-1] + (d + 1,)
    if rng.random() < 0.03:
        x_shape = (n, k, d, 1)
    images, captions = _cast(rng, _values(rng, x_shape)), _cast(rng, _values(rng, y_shape))
    kw: dict = {"measure": measure}
    if rng.random() < 0.3:
        kw["chunk_size"] = int(rng.integers(-1, 4))
    if measure == "smooth_chamfer" and rng.random() < 0.5:
        kw["alpha"] = float(rng.choice([-1.0, 0.0, 0.5, 16.0, 1e3]))
    if measure in ("match_prob", "log_match_prob") and rng.random() < 0.5:
        kw.update(a=float(rng.choice([0.1, 5.0, 50.0])), b=float(rng.choice([-5.0, 5.0, 50.0])))
    return dict(images=images, captions=captions, **kw)


def test_fuzz_compute_similarity():
    rng = np.random.default_rng(7)
    outcomes = {"ok": 0, "error": 0, "oracle": 0}
    for case_no in range(N_SIM):
        case = _random_sim_case(rng)
        try:
            s = compute_similarity(**case)
        except XmrError as e:
            assert "\n" not in str(e), str(e)
            outcomes["error"] += 1
            continue
        except Exception as e:  # noqa: BLE001
            summary = {k: (v.dtype, v.shape) if isinstance(v, np.ndarray) else v for k, v in case.items()}
            raise AssertionError(f"case {case_no}: {type(e).__name__}: {e} for {summary}") from e
        outcomes["ok"] += 1
        n, m = len(case["images"]), len(case["captions"])
        assert isinstance(s, np.ndarray) and s.shape == (n, m) and s.dtype == np.float32  # NumPy in, NumPy out
        if s.size == 0:
            continue
        x64 = np.asarray(case["images"], np.float64)
        if np.abs(x64).max(initial=0) < 1e30 and np.abs(np.asarray(case["captions"], np.float64)).max(initial=0) < 1e30:
            assert np.isfinite(s).all(), (case_no, case["measure"])
        measure = case["measure"]
        if measure in ("cosine", "max", "mean", "chamfer"):
            assert np.abs(s).max() <= 1.0 + 1e-5, (case_no, measure)
        elif measure == "match_prob":
            assert ((s >= 0) & (s <= 1)).all(), (case_no, measure)
        elif measure == "log_match_prob":
            assert (s <= 1e-6).all(), (case_no, measure)
        if measure == "cosine":  # the formula itself, in float64
            x = x64.reshape(n, -1)
            y = np.asarray(case["captions"], np.float64).reshape(m, -1)
            norms = np.concatenate([np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)])
            if norms.min() > 1e-6 and norms.max() < 1e15:  # no zero vectors, no float32 overflow
                unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
                np.testing.assert_allclose(s, unit(x) @ unit(y).T, atol=1e-5)
                outcomes["oracle"] += 1
    print(outcomes)
    assert outcomes["ok"] > N_SIM // 4 and outcomes["error"] > N_SIM // 20 and outcomes["oracle"] > N_SIM // 50, \
        outcomes


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_cli_evaluate_few_cases(tmp_path, capsys, seed):
    """A handful of random files through the CLI itself: exit 0 with a metrics file, or 2 with one line and
    no file."""
    rng = np.random.default_rng(1000 + seed)
    case = _random_eval_case(rng)
    path = tmp_path / "S.npy"
    np.save(path, case["sims"], allow_pickle=case["sims"].dtype == object)
    out = tmp_path / "M.json"
    args = ["evaluate", "--sims", str(path), "--captions-per-image", str(case["captions_per_image"]),
            "--ties", case["ties"] if case["ties"] in TIE_POLICIES else "index", "--out", str(out)]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc in (0, 2)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and not out.exists()
    else:
        assert out.exists()
