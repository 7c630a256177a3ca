"""The seeded benchmark: statistics of a difference (worked by hand), verdicts, gathering per-seed results files
into tables and claims, and the file's validation."""

import json
import math

import numpy as np
import pytest
import yaml

from xmr.core.errors import XmrError
from xmr.studies.benchmark import compare, holm, load_benchmark, mean_std, verdict, write_benchmark

from conftest import REPO, run_xmr, toy_config


def test_mean_std_uses_the_sample_standard_deviation():
    assert mean_std([10, 12, 14]) == (12.0, 2.0)  # deviations -2, 0, 2: sqrt(8 / 2)


def test_welch_and_paired_standard_errors_by_hand():
    better, worse = {0: 10.0, 1: 12.0, 2: 14.0}, {0: 8.0, 1: 9.0, 2: 10.0}
    # Welch: sqrt(2^2 / 3 + 1^2 / 3) = sqrt(5 / 3)
    w = compare(better, worse, paired=False)
    assert w["diff"] == pytest.approx(3.0) and w["se"] == pytest.approx(math.sqrt(5 / 3))
    # paired: differences 2, 3, 4 -> sd 1 -> SE 1 / sqrt(3)
    p = compare(better, worse, paired=True)
    assert p["diff"] == pytest.approx(3.0) and p["se"] == pytest.approx(1 / math.sqrt(3))


def test_paired_t_test_of_three_seeds_by_hand():
    # differences 1, 2, 6: mean 3, deviations -2, -1, 3 -> variance 14 / 2 = 7, SE sqrt(7 / 3), t = 3 / SE, df 2.
    # Student's t with 2 df: P(|T| > t) = 1 - t / sqrt(2 + t^2); t^2 = 27 / 7 -> p = 1 - sqrt(27 / 41) = 0.1885
    # (the old "> 2 SE" rule at 2 df: about this p, not 0.05)
    c = compare({0: 11.0, 1: 12.0, 2: 16.0}, {0: 10.0, 1: 10.0, 2: 10.0}, paired=True)
    assert c["se"] == pytest.approx(math.sqrt(7 / 3)) and c["t"] == pytest.approx(3 / math.sqrt(7 / 3))
    assert c["df"] == 2 and c["p"] == pytest.approx(1 - math.sqrt(27 / 41), abs=1e-9)


def test_welch_t_test_by_hand():
    # equal variances (4) and sizes (3): SE^2 = 4/3 + 4/3 = 8/3, t = 6 / sqrt(8/3) (t^2 = 13.5);
    # Welch-Satterthwaite df = (8/3)^2 / ((4/3)^2 / 2 + (4/3)^2 / 2) = 4.
    # Student's t with 4 df: with x = t / sqrt(4 + t^2), P(|T| > t) = 1 - x (3 - x^2) / 2; x^2 = 13.5 / 17.5 = 27 / 35
    c = compare({0: 10.0, 1: 12.0, 2: 14.0}, {0: 4.0, 1: 6.0, 2: 8.0}, paired=False)
    x = math.sqrt(27 / 35)
    assert c["t"] == pytest.approx(6 / math.sqrt(8 / 3)) and c["df"] == pytest.approx(4.0)
    assert c["p"] == pytest.approx(1 - x * (3 - x * x) / 2, abs=1e-9)  # 0.0213
    # unequal variances 4 and 1: df = (5/3)^2 / ((4/3)^2 / 2 + (1/3)^2 / 2) = (25/9) / (17/18) = 50 / 17
    c = compare({0: 10.0, 1: 12.0, 2: 14.0}, {0: 8.0, 1: 9.0, 2: 10.0}, paired=False)
    assert c["df"] == pytest.approx(50 / 17)


def test_holm_adjustment_by_hand():
    # sorted 0.01, 0.03, 0.04, 0.20 (m = 4): 4 x 0.01 = 0.04; 3 x 0.03 = 0.09; 2 x 0.04 = 0.08 -> max(0.09, 0.08)
    # = 0.09 (step-down keeps the order); 1 x 0.20 = 0.20. NaN (a claim not run) is not in the family.
    adj = holm([0.01, 0.04, 0.03, float("nan"), 0.20])
    assert adj[:3] == pytest.approx([0.04, 0.09, 0.09]) and math.isnan(adj[3]) and adj[4] == pytest.approx(0.20)
    assert holm([0.5, 0.4]) == pytest.approx([0.8, 0.8])  # 2 x 0.4 = 0.8; 1 x 0.5 -> max(0.8, 0.5)
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1


def test_the_four_verdicts_at_the_adjusted_p_values():
    nan = float("nan")
    assert verdict(3.0, 0.01) == "holds"  # the one-sided p of the claimed direction below alpha
    assert verdict(3.0, 0.01, scope="synth") == "holds on synth"  # scoped to where it was measured
    # the non-superiority test rules out a gain of Δ; its upper bound below 0 -> reversed, else no effect ≥ Δ
    assert verdict(-3.0, 0.99, 0.01, upper=-0.5, scope="synth") == "reversed on synth"
    assert verdict(1.0, 0.2, 0.01, upper=4.0) == "no effect ≥ Δ"
    assert verdict(3.0, 0.05, 0.05) == "underpowered"  # neither below alpha = 0.05
    assert verdict(1.0, nan, nan) == "underpowered"  # no test at all (one seed)


def result(rsum_all: float, rsum_amb: float) -> dict:
    """A results dict whose six recalls add up to the given RSUMs (i2t R@1 carries the difference)."""
    def part(rsum):
        return {"i2t": {"r1": rsum - 250, "r5": 50, "r10": 50, "medr": 1, "meanr": 1},
                "t2i": {"r1": 50, "r5": 50, "r10": 50, "medr": 1, "meanr": 1}, "rsum": rsum}
    return {**part(rsum_all), "subsets": {"ambiguous": {**part(rsum_amb), "n_images": 3, "n_captions": 3}}}


@pytest.fixture
def bench_dir(tmp_path):
    cfg = toy_config(tmp_path, ("a", "b"))  # recipes that resolve (the claims' sides are checked for training alike)
    (cfg / "benchmark").mkdir()
    doc = {"name": "bench", "dataset": "toy", "seeds": [0, 1, 2], "rerank": ["none", "fr"],
           "smallest_effect": {"rsum": 5.0},
           "variants": {"a": {"recipe": "a"}, "b": {"recipe": "b", "set": {"model.embed_dim": 8}}},
           "claims": [{"claim": "a beats b", "source": "T1", "better": "a", "worse": "b"},
                      {"claim": "FR helps a", "source": "T2", "better": "a:fr", "worse": "a"},
                      {"claim": "a beats b on ambiguous", "source": "T3", "better": "a", "worse": "b",
                       "subset": "ambiguous"}]}
    (cfg / "benchmark" / "bench.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    rsums = {"a": ([300, 302, 304], [100, 140, 120]), "b": ([290, 291, 292], [130, 110, 150])}
    for v, (alls, ambs) in rsums.items():
        for seed, (r_all, r_amb) in enumerate(zip(alls, ambs)):
            path = tmp_path / "results" / "toy" / "bench" / "bench" / v / f"s{seed}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            # FR adds 5 + seed to variant a (paired differences 5, 6, 7)
            fr = result(r_all + (5 + seed if v == "a" else 0), r_amb)
            path.write_text(json.dumps({"by_rerank": {"none": result(r_all, r_amb), "fr": fr}}))
            write_ranks(path)
    return tmp_path


def write_ranks(path) -> None:
    """Per-query ranks of two images with one caption each: FR lifts image 1 and caption 1 from rank 5 (a hit at
    R@10 only) to rank 0 (R@1, R@5, R@10), so image cluster 1 adds 2 hits x 100 / 2 queries per direction = +200
    RSUM and cluster 0 nothing."""
    np.savez(path.with_suffix(".ranks.npz"), **{"none/i2t": np.array([0, 5]), "none/t2i": np.array([0, 5]),
                                                "fr/i2t": np.array([0, 0]), "fr/t2i": np.array([0, 0]),
                                                "captions_per_image": np.array(1)})


def test_tables_and_claims_from_per_seed_results(bench_dir):
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    assert bench.train_overrides("b", 2) == ['model.embed_dim=8', 'train.seed=2', 'name="bench.b.s2"']
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    claims = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    # a: 302 ± 2, b: 291 ± 1 -> diff 11, Welch SE sqrt(4/3 + 1/3) = 1.29, t = 8.52 at df 50/17 = 2.94: the one-sided
    # p (the claimed direction) is below its value at df 2, (1 - t / sqrt(2 + t^2)) / 2 = 0.0068
    c = claims["a beats b"]
    assert (c["better_mean"], c["better_std"], c["worse_mean"], c["worse_std"]) == pytest.approx((302, 2, 291, 1))
    assert c["se"] == pytest.approx(math.sqrt(5 / 3)) and not c["paired"] and c["df"] == pytest.approx(50 / 17)
    t = 11 / math.sqrt(5 / 3)
    p_ab = c["p"]
    assert 0 < p_ab < (1 - t / math.sqrt(2 + t * t)) / 2 and c["p_two_sided"] == pytest.approx(2 * p_ab)
    # FR on a: paired differences 5, 6, 7 -> 6 ± 1 / sqrt(3), t = 6 sqrt(3), df 2: one-sided p = (1 - sqrt(108 / 110)) / 2
    c = claims["FR helps a"]
    assert c["paired"] and c["diff"] == pytest.approx(6.0) and c["se"] == pytest.approx(1 / math.sqrt(3))
    p_fr = (1 - math.sqrt(108 / 110)) / 2  # 0.0046
    assert c["p"] == pytest.approx(p_fr, abs=1e-9)
    # ambiguous: a 120 ± 20 vs b 130 ± 20 -> -10, SE sqrt(400/3 * 2) = 16.3, t = -0.612, df 4 -> one-sided p 0.713
    c = claims["a beats b on ambiguous"]
    # neither test decides: no gain shown, nor a gain of 5 ruled out (non-superiority: t = -15 / 16.3 = -0.92, p 0.21)
    assert c["diff"] == pytest.approx(-10.0) and c["verdict"] == "underpowered on toy" and c["df"] == pytest.approx(4)
    assert c["p"] == pytest.approx(1 - c["p_two_sided"] / 2) and 0.2 < c["p_non_superiority"] < 0.22
    assert c["detectable"] > 5.0  # the design could not see an effect of 5 RSUM
    # Holm over the 3 claims: p_ab (0.0018) x 3 = 0.0055, then max(that, p_fr x 2 = 0.0091), both < 0.05 -> hold
    assert p_ab < p_fr
    assert claims["a beats b"]["p_holm"] == pytest.approx(3 * p_ab)
    assert claims["FR helps a"]["p_holm"] == pytest.approx(max(3 * p_ab, 2 * p_fr)) and 2 * p_fr < 0.05
    assert claims["a beats b"]["verdict"] == claims["FR helps a"]["verdict"] == "holds on toy"
    assert claims["a beats b on ambiguous"]["p_holm"] == pytest.approx(c["p"])
    fr = claims["FR helps a"]
    # the bounds at the level the verdict used: FR is Holm's second step, level 0.05 / 2 -> t_0.975,2 = 4.302653,
    # lower bound 6 - 4.302653 / sqrt(3) = 3.51586; unadjusted 90 % interval: t_0.95,2 = 2.919986 -> 6 ± 1.68586
    assert fr["level_low"] == pytest.approx(0.025) and fr["bound_low"] == pytest.approx(6 - 2.48414, abs=1e-4)
    assert (fr["ci_low"], fr["ci_high"]) == pytest.approx((6 - 1.68586, 6 + 1.68586), abs=1e-4)
    assert fr["family"] == "all" and fr["family_size"] == 3 and fr["alpha"] == pytest.approx(0.05 / 3)
    # permutation over seeds: FR's three paired differences 5, 6, 7: only the all-positive of the 2^3 sign flips
    # reaches a mean of 6 -> p = 1/8; a's 300..304 against b's 290..292: only the observed split of the C(6, 3) = 20
    # reaches 11 -> p = 1/20. Holm: 3 x 0.05 = 0.15, max(0.15, 2 x 0.125) = 0.25: no decision, where the t test holds
    assert fr["perm_p"] == pytest.approx(1 / 8) and claims["a beats b"]["perm_p"] == pytest.approx(1 / 20)
    assert fr["perm_p_holm"] == pytest.approx(0.25) and claims["a beats b"]["perm_p_holm"] == pytest.approx(0.15)
    assert fr["tests_disagree"] and claims["a beats b"]["tests_disagree"]
    # query level (write_ranks): +200 per seed; the two clusters 0 and +200 resampled: SE sqrt(2 * 100^2) per seed,
    # over 3 seeds / sqrt(3) = 81.6
    assert fr["query_diff"] == pytest.approx(200.0) and fr["query_se"] == pytest.approx(81.65, rel=0.06)
    assert math.isnan(claims["a beats b"]["query_diff"])  # other trained models: no query-level pairing
    md = paths["md"].read_text()
    assert "| a | 52.0 ± 2.0 | 50.0 ± 0.0 |" in md  # i2t R@1 = RSUM - 250
    assert "302.0 ± 2.0" in md and "subset `ambiguous`" in md
    claims_md = paths["claims_md"].read_text()
    assert "**holds on toy**" in claims_md and "0.250 ≠" in claims_md  # the permutation test disagrees, marked
    assert "Measured on the toy test split" in claims_md
    assert paths["png"].stat().st_size > 1000 and paths["csv"].read_text().startswith("variant,seed,rerank,subset")


def test_missing_results_and_bad_files_are_named(bench_dir):
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    (bench_dir / "results" / "toy" / "bench" / "bench" / "b" / "s1.json").unlink()
    with pytest.raises(XmrError, match=r"1 benchmark results missing, e\.g\. .*b/s1\.json"):
        write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    path = bench_dir / "config" / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["claims"][0]["better"] = "c"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError, match=r"claims\[0\]\.better: no variant 'c'"):
        load_benchmark(path)
    doc["claims"][0]["better"] = "a:qbnorm"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError, match=r"re-ranker 'qbnorm' is not in rerank"):
        load_benchmark(path)


def test_the_shipped_benchmark_resolves_every_run_config():
    bench = load_benchmark("benchmark")
    assert len(bench.seeds) >= 3 and bench.dataset == "synth"
    for v in bench.variants:
        cfg = bench.run_config(v, bench.seeds[0])
        assert cfg["train"]["seed"] == bench.seeds[0] and cfg["name"] == f"benchmark.{v}.s{bench.seeds[0]}"


def test_allow_missing_lists_the_missing_runs_and_marks_their_claims(bench_dir):
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    for seed in (0, 1, 2):
        (bench_dir / "results" / "toy" / "bench" / "bench" / "b" / f"s{seed}.json").unlink()
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs", strict=False)
    claims = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    assert claims["a beats b"]["verdict"] == "not run"
    assert claims["FR helps a"]["verdict"] == "holds on toy"  # both sides present
    assert "3 of 6 runs have no results yet** (b/s0, b/s1, b/s2)" in paths["md"].read_text()


def test_training_table_flags_collapsed_runs_and_curves_are_drawn(bench_dir):
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    assert bench.degenerate_std == 0.01  # the schema default
    for v, std in (("a", 0.12), ("b", 0.004)):
        for seed in (0, 1, 2):
            path = bench_dir / "results" / "toy" / "bench" / "bench" / v / f"s{seed}.json"
            doc = json.loads(path.read_text())
            doc.update(similarity_spread={"std": std, "margin": 0.1 if v == "a" else 0.001},
                       epochs_trained=10 + seed, best_epoch=4 + seed, stopped_by="plateau" if seed else "cap",
                       train_seconds=100.0 * (10 + seed))
            doc["by_rerank"]["none"]["captions_per_image"] = 2  # where `xmr test --reranks` writes it
            path.write_text(json.dumps(doc))
            run = bench.run_dir(v, seed, bench_dir / "runs")
            run.mkdir(parents=True)
            if v == "a":  # a scored test matrix of 40 images x 80 captions ranking every positive first
                np.save(run / "test_sims.npy", np.repeat(np.eye(40), 2, axis=1))
            run.joinpath("history.csv").write_text("epoch,loss,val_rsum\n1,5,100\n2,4,120\n3,3,125\n")
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    md = paths["md"].read_text()
    # a: 10-12 epochs, best 4-6, 100 s per epoch, (1000 + 1100 + 1200) / 3 s = 18.3 min per run,
    # std 0.1200 ± 0.0000, in-batch top-1 1 at B 32 (every positive first), none at B 128 (only 40 images),
    # not collapsed; b: all three below 0.01, no scored matrix
    # (no set statistics in these files: the set columns show –)
    row_a = ("| a | 32 | 10–12 | 4–6 | cap ×1, plateau ×2 | 100 | 18.3 | 0.1200 ± 0.0000 | 0.1000 ± 0.0000 | "
             "1.00 ± 0.00 | – | – | – | no |")
    row_b = ("| b | 32 | 10–12 | 4–6 | cap ×1, plateau ×2 | 100 | 18.3 | 0.0040 ± 0.0000 | 0.0010 ± 0.0000 | – | – | "
             "– | – | ⚠ 3 of 3 |")
    assert row_a in md and row_b in md
    # the short part (README): the same table and the time line, none of the recall tables
    short = paths["training_md"].read_text()
    assert row_a in short and row_b in short and "trainings (2 variants × 3 seeds)" in short
    assert "no re-ranking" not in short
    assert paths["curves_png"].stat().st_size > 1000
    training = json.loads(paths["json"].read_text())["training"]
    assert sum(r["collapsed"] for r in training) == 3


def test_set_correlation_claims_lower_is_better_and_training_columns(bench_dir):
    """A claim on the sub-embedding correlation: lower is better, so the difference is worse − better; runs without
    set statistics give "not measured"; the training table shows correlation and slot entropy."""
    doc = yaml.safe_load((bench_dir / "config" / "benchmark" / "bench.yaml").read_text())
    doc["smallest_effect"].update(correlation=0.02, residual_correlation=0.02)
    doc["claims"] = [{"claim": "a less correlated", "source": "F6", "better": "a", "worse": "b", "metric": "correlation"},
                     {"claim": "b less correlated", "source": "F6", "better": "b", "worse": "a", "metric": "correlation"},
                     {"claim": "residuals", "source": "E4", "better": "a", "worse": "b",
                      "metric": "residual_correlation"}]
    (bench_dir / "config" / "benchmark" / "bench.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    corr = {"a": [0.20, 0.21, 0.22], "b": [0.60, 0.62, 0.64]}
    for v in ("a", "b"):
        for seed in (0, 1, 2):
            path = bench_dir / "results" / "toy" / "bench" / "bench" / v / f"s{seed}.json"
            d = json.loads(path.read_text())
            d["set_statistics"] = {"k": 2, "correlation": corr[v][seed],
                                   "slot_usage": {"entropy_normalised": 0.5 if v == "a" else 1.0}}
            path.write_text(json.dumps(d))
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    claims = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    # a 0.21 ± 0.01, b 0.62 ± 0.02: b - a = 0.41, Welch SE sqrt(0.0001/3 + 0.0004/3) = 0.01291, t = 31.8 at
    # df (0.0005/3)^2 / ((0.0001/3)^2/2 + (0.0004/3)^2/2) = 50/17
    c = claims["a less correlated"]
    se = math.sqrt(0.0005 / 3)
    assert c["diff"] == pytest.approx(0.41) and c["se"] == pytest.approx(se) and c["df"] == pytest.approx(50 / 17)
    assert c["t"] == pytest.approx(0.41 / se) and (c["better_mean"], c["worse_mean"]) == pytest.approx((0.21, 0.62))
    assert c["verdict"] == "holds on toy"
    b_claim = claims["b less correlated"]
    # the other way round: a gain is ruled out, and the non-superiority bound is below 0 -> reversed
    assert b_claim["diff"] == pytest.approx(-0.41) and b_claim["verdict"] == "reversed on toy"
    # a family of two tested claims (residuals not measured): a's one-sided p is the smaller, x 2
    assert c["p_holm"] == pytest.approx(2 * c["p"]) and c["family_size"] == 2
    assert b_claim["p_holm"] == pytest.approx(b_claim["p"])  # max(2 p_a, 1 x p_b), p_b near 1
    assert claims["residuals"]["verdict"] == "not measured"
    md = paths["claims_md"].read_text()
    # Welch: SE sqrt((0.01^2 + 0.02^2) / 3) = 0.01291 at df 50/17. a's superiority p is Holm's first step (level
    # 0.05 / 2: lower bound 0.41 - t_0.975,df SE); its non-superiority p is the second (b's is tiny), level 0.05:
    # upper bound 0.41 + t_0.95,df SE
    from scipy import stats

    se = math.sqrt(5e-4 / 3)
    low, high = 0.41 - stats.t.ppf(0.975, 50 / 17) * se, 0.41 + stats.t.ppf(0.95, 50 / 17) * se
    assert "`a` vs `b` (correlation, lower is better)" in md
    assert f"| 0.210 ± 0.010 | 0.620 ± 0.020 | +0.410 [{low:+.3f}, {high:+.3f}] |" in md
    # training table: set corr. and slot entropy, mean ± std over seeds
    assert "| 0.210 ± 0.010 | 0.50 ± 0.00 |" in paths["md"].read_text()
    assert "| 0.620 ± 0.020 | 1.00 ± 0.00 |" in paths["md"].read_text()


def test_a_benchmark_of_plain_evaluation_only_reads_plain_results_files(bench_dir):
    """`rerank: [none]` (config/benchmark/dvse_sets.yaml): `xmr test` then writes a plain results file, with no
    by_rerank; the tables read it as the plain evaluation."""
    doc = yaml.safe_load((bench_dir / "config" / "benchmark" / "bench.yaml").read_text())
    doc["rerank"] = ["none"]
    doc["claims"] = [c for c in doc["claims"] if ":" not in c["better"]]
    (bench_dir / "config" / "benchmark" / "bench.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for path in (bench_dir / "results").rglob("s*.json"):
        path.write_text(json.dumps({**json.loads(path.read_text())["by_rerank"]["none"], "rerank": "none"}))
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    c = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}["a beats b"]
    assert (c["better_mean"], c["worse_mean"], c["diff"]) == pytest.approx((302, 291, 11))  # as with by_rerank


def test_a_claim_between_runs_trained_differently_is_refused_unless_its_row_says_so(bench_dir):
    """A protocol setting (TRAINED_ALIKE) may differ only where the claim's `differs:` names it, and the claims
    table shows it in the row."""
    path = bench_dir / "config" / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["variants"]["b"]["set"]["train.batch_size"] = 128
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"claims\[0\] \(a beats b\): `a` and `b` differ in the protocol setting "
                                       r"train\.batch_size \(32 vs 128\); make them equal, or name it under"):
        write_benchmark(load_benchmark(path), bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    for i in (0, 2):
        doc["claims"][i]["differs"] = {"train.batch_size": "b at batch 128 (its paper's)"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    paths = write_benchmark(load_benchmark(path), bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in paths["claims_md"].read_text().splitlines()}
    assert rows["a beats b"].endswith("| the claim's `train.batch_size` |")
    assert rows["FR helps a"].endswith("| same models |")  # a re-ranker against plain: the same runs
    assert "| 128 |" in paths["training_md"].read_text()  # the training table's batch column


def test_an_undeclared_difference_is_refused_by_the_command_and_a_declared_one_is_shown(bench_dir):
    """`xmr benchmark-table` refuses a claim whose sides differ in a setting neither method declares, in one line
    naming the claim and the key; declared in config/method_settings.yaml, the row names it by its key."""
    cfg = bench_dir / "config"
    recipe = cfg / "recipes" / "toy" / "b.yaml"
    recipe.write_text(recipe.read_text() + "\noptim: {grad_clip: 1.0}\n")  # a: the default 2.0
    cmd = ["benchmark-table", "--benchmark", cfg / "benchmark" / "bench.yaml", "--results-root", bench_dir / "results",
           "--runs-root", bench_dir / "runs", "--out-dir", bench_dir / "out"]
    res = run_xmr(*cmd, cwd=bench_dir)
    assert res.returncode != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "claims[0] (a beats b): `a` and `b` differ in optim.grad_clip (2.0 vs 1.0), declared " \
        "by neither method" in err[0] and "method_settings.yaml" in err[0], res.stderr
    assert not (bench_dir / "out" / "bench_claims.md").exists()  # nothing half-written
    method = yaml.safe_load(recipe.read_text()).get("method") or "vsepp"
    (cfg / "method_settings.yaml").write_text(yaml.safe_dump(
        {method: {"optim.grad_clip": {"value": 1.0, "source": "its code's --grad_clip 1"}}}))
    res = run_xmr(*cmd, cwd=bench_dir)
    assert res.returncode == 0, res.stderr
    text = (bench_dir / "out" / "bench_claims.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert rows["a beats b"].endswith(f"| {method}'s `optim.grad_clip` |")
    assert f"{method} `optim.grad_clip` 1.0: its code's --grad_clip 1" in text


def test_the_shipped_benchmarks_compare_runs_trained_alike():
    from xmr.studies.benchmark import benchmark_names, check_trained_alike

    for name in benchmark_names():
        check_trained_alike(load_benchmark(name))  # raises on a claim whose sides train differently
    bench = load_benchmark("benchmark")
    assert {bench.run_config(v, 0)["train"]["batch_size"] for v in bench.variants} == {32}


def test_runs_from_reuses_the_runs_of_same_named_variants(bench_dir):
    cfg = bench_dir / "config" / "benchmark"
    doc = {"name": "sets", "dataset": "toy", "seeds": [0, 1], "rerank": ["none"], "runs_from": "bench",
           "smallest_effect": {"rsum": 5.0},
           "variants": {"a": {"recipe": "a"}, "c": {"recipe": "a", "set": {"model.embed_dim": 16}}}}
    (cfg / "sets.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    sets = load_benchmark(cfg / "sets.yaml")
    assert sets.shared == {"a"}
    assert str(sets.run_dir("a", 1)) == "runs/toy/bench/bench/a/s1"  # bench's run, trained once
    assert str(sets.run_dir("c", 1)) == "runs/toy/bench/sets/c/s1"
    assert str(sets.result_path("a", 0)).endswith("results/toy/bench/bench/a/s0.json")
    doc["variants"]["b"] = {"recipe": "b"}  # bench's b sets model.embed_dim: 8
    (cfg / "sets.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"runs_from: bench: variants\.b has the name of bench's variant but not its "
                                       r"recipe and overrides"):
        load_benchmark(cfg / "sets.yaml")
    doc["variants"].pop("b")
    doc["seeds"] = [0, 5]
    (cfg / "sets.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"its seeds \[0, 1, 2\] and re-rankers .* must include this file's"):
        load_benchmark(cfg / "sets.yaml")


def test_run_times_are_read_at_each_runs_median_epoch(bench_dir):
    """A run paused for 1,000 s in its second epoch: train.json's train_seconds counts the stall, its median epoch
    does not. Variant a, seeds 0-2: epochs of 10, 1000, 12, 11 s (seed 0; median 11.5) and of 10, 10, 10, 10 s
    (seeds 1, 2); b has no history (its mean epoch from train_seconds stands in)."""
    import re

    for seed in (0, 1, 2):
        run = bench_dir / "runs" / "toy" / "bench" / "bench" / "a" / f"s{seed}"
        run.mkdir(parents=True)
        secs = [10, 1000, 12, 11] if seed == 0 else [10, 10, 10, 10]
        (run / "history.csv").write_text("epoch,seconds\n" + "".join(f"{i + 1},{s}\n" for i, s in enumerate(secs)))
        (run / "train.json").write_text(json.dumps({"train_seconds": sum(secs), "epochs_trained": 4}))
        (run / "config.yaml").write_text("{}")
        res = bench_dir / "results" / "toy" / "bench" / "bench" / "a" / f"s{seed}.json"
        res.write_text(json.dumps({**json.loads(res.read_text()), "train_seconds": sum(secs), "epochs_trained": 4}))
    for seed in (0, 1, 2):
        res = bench_dir / "results" / "toy" / "bench" / "bench" / "b" / f"s{seed}.json"
        res.write_text(json.dumps({**json.loads(res.read_text()), "train_seconds": 120.0, "epochs_trained": 4}))
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    md = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")["training_md"].read_text()
    rows = {ln.split(" | ")[0].strip("| "): ln.split(" | ") for ln in md.splitlines() if ln.startswith("| a |")
            or ln.startswith("| b |")}
    # a: s / epoch = mean(11.5, 10, 10) = 10.5 -> "10" (round half to even); min / run = mean(46, 40, 40) s / 60 = 0.7
    assert rows["a"][5:7] == ["10", "0.7"]
    # b: 120 s / 4 epochs = 30 s; 2.0 min a run
    assert rows["b"][5:7] == ["30", "2.0"]
    # the sums of a's runs only (b's runs have no run directory): measured 1033 + 40 + 40 = 1113 s = 18.55 min;
    # at the median epoch 46 + 40 + 40 = 126 s = 2.1 min
    assert re.search(r"18\.6 min of training measured in all, 2\.1 at each run's median epoch time", md)


def test_detectable_effect_is_the_noncentral_t_power_point():
    """At large df the t test is the z test: δ = (z_0.975 + z_0.8) SE = (1.959964 + 0.841621) SE; at df 4 a
    simulated t test at that δ rejects 80 % of the time (two-sided, α 0.05)."""
    from xmr.evaluation.stats import detectable_effect

    assert detectable_effect(2.0, 1e7, 0.05, 0.8) == pytest.approx(2 * 2.801585, rel=1e-4)
    # one-sided (the claims' test): (z_0.95 + z_0.8) SE = (1.644854 + 0.841621) SE
    assert detectable_effect(2.0, 1e7, 0.05, 0.8, sides=1) == pytest.approx(2 * 2.486475, rel=1e-4)
    se, df = 1.5, 4
    delta = detectable_effect(se, df, 0.05, 0.8)
    rng = np.random.default_rng(0)
    sims = 200_000  # paired design with n = 5: mean of N(δ, σ) over 5, SE σ / sqrt(5) = se
    sigma = se * math.sqrt(5)
    x = rng.normal(delta, sigma, size=(sims, 5))
    t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(5))
    from scipy import stats

    crit = stats.t.ppf(0.975, df)
    assert np.mean(np.abs(t) > crit) == pytest.approx(0.8, abs=0.005)
    assert detectable_effect(0.0, 2, 0.05) == 0.0 and math.isnan(detectable_effect(float("nan"), 2, 0.05))


def test_equivalence_p_is_the_larger_one_sided_p():
    """TOST: at diff 0, SE 1, df → ∞ and margin 1.644854 each one-sided p is 0.05; a difference beyond the margin
    is never equivalent (p ≥ 0.5)."""
    from xmr.evaluation.stats import equivalence_p

    assert equivalence_p(0.0, 1.0, 1e7, 1.644854) == pytest.approx(0.05, abs=1e-5)
    # diff 1: the upper test (H0 diff >= 1.644854) has z = -0.644854 -> p = 0.2595; the lower one is tiny
    assert equivalence_p(1.0, 1.0, 1e7, 1.644854) == pytest.approx(0.25951, abs=1e-4)
    assert equivalence_p(6.0, 1.0, 3, 5.0) > 0.5


def test_cluster_bootstrap_matches_the_analytic_standard_error():
    """Each stratum's sum over n resampled clusters has variance n · var_pop(d); the statistic is the mean over the
    S strata, so SE = sqrt(sum_s n var_s) / S."""
    from xmr.evaluation.stats import cluster_bootstrap

    rng = np.random.default_rng(1)
    strata = [rng.normal(0.1, 1.0, 400), rng.normal(0.1, 2.0, 400)]
    res = cluster_bootstrap(strata, resamples=4000, seed=0)
    assert res["diff"] == pytest.approx(np.mean([d.sum() for d in strata]))
    expected = math.sqrt(sum(d.size * d.var() for d in strata)) / 2
    assert res["se"] == pytest.approx(expected, rel=0.05)
    assert res["ci_low"] < res["diff"] < res["ci_high"]
    same = cluster_bootstrap([np.full(10, 0.5)], resamples=200)
    assert same["se"] == pytest.approx(0.0, abs=1e-12) and same["p"] == 0.0


def test_query_differences_add_up_to_the_metric_difference():
    """Per image cluster (image + its 2 captions), the contributions sum to RSUM(better) - RSUM(worse) of the two
    rank sets (recall_metrics); a subset keeps its own clusters and its own denominators."""
    from xmr.evaluation.metrics import recall_metrics, rsum
    from xmr.studies.benchmark import query_differences

    rng = np.random.default_rng(2)
    n, c = 6, 2
    ranks = {"fr/i2t": rng.integers(0, 20, n), "none/i2t": rng.integers(0, 20, n),
             "fr/t2i": rng.integers(0, 20, n * c), "none/t2i": rng.integers(0, 20, n * c),
             "captions_per_image": np.array(c),
             "subset/amb/images": np.array([1, 0, 1, 0, 0, 0], bool),
             "subset/amb/captions": np.array([1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0], bool)}

    def rs(rr, im=slice(None), cm=slice(None)):
        return rsum(recall_metrics(ranks[f"{rr}/i2t"][im]), recall_metrics(ranks[f"{rr}/t2i"][cm]))

    d = query_differences(ranks, "fr", "none")
    assert d.shape == (n,) and d.sum() == pytest.approx(rs("fr") - rs("none"))
    im, cm = ranks["subset/amb/images"], ranks["subset/amb/captions"]
    sub = query_differences(ranks, "fr", "none", subset="amb")
    assert sub.shape == (2,)  # clusters of images 0 and 2 (with their captions 0, 1 and 4); the rest hold none
    assert sub.sum() == pytest.approx(rs("fr", im, cm) - rs("none", im, cm))
    r1 = query_differences(ranks, "fr", "none", metric="i2t_r1")
    assert r1.sum() == pytest.approx(100 * (np.mean(ranks["fr/i2t"] < 1) - np.mean(ranks["none/i2t"] < 1)))


def test_validation_curves_say_mean_and_std_only_where_a_line_has_several_runs():
    """A figure of one seed per line (a ladder, a quick study) does not claim a mean ± std over seeds."""
    from xmr.studies.benchmark import validation_curves_label

    one = {"vsepp": [[{"epoch": 1, "val_rsum": 100.0}]], "pvse": [[{"epoch": 1, "val_rsum": 90.0}]]}
    assert validation_curves_label(one) == "validation RSUM (one run per line)"
    one["vsepp"].append([{"epoch": 1, "val_rsum": 104.0}])  # a second seed of vsepp: its line is a mean
    assert validation_curves_label(one) == "validation RSUM (mean ± std over seeds)"


def test_non_superiority_is_one_sided_where_the_equivalence_test_was_not():
    """A directional claim that lost: -2.9 with a 95 % interval of ± 6.0 at df 4 (SE = 6.0 / t_0.975,4). The gain of
    interest Δ = 5 is ruled out one-sided: t = (-2.9 - 5) / SE, and with x = t / sqrt(4 + t^2) Student's t at 4 df has
    F(t) = 1/2 + x (3 - x^2) / 4 = 0.0108 < 0.05. The two-sided TOST asked also for |-2.9| < 5 from below: its other
    one-sided p, P(T > (-2.9 + 5) / SE) = 0.19, kept it undecided."""
    from xmr.evaluation.stats import equivalence_p, non_superiority_p

    se = 6.0 / 2.7764451
    t = (-2.9 - 5.0) / se
    x = t / math.sqrt(4 + t * t)
    assert non_superiority_p(-2.9, se, 4, 5.0) == pytest.approx(0.5 + x * (3 - x * x) / 4, abs=1e-9)
    assert non_superiority_p(-2.9, se, 4, 5.0) == pytest.approx(0.01083, abs=1e-4)
    assert equivalence_p(-2.9, se, 4, 5.0) > 0.15
    # at df -> ∞ the z test: a difference of 0 with SE 1 rules out Δ = 1.644854 at p = 0.05
    assert non_superiority_p(0.0, 1.0, 1e7, 1.644854) == pytest.approx(0.05, abs=1e-5)


def test_no_effect_verdict_from_the_one_sided_non_superiority_test(bench_dir):
    """FR adds -0.5, 0, +0.5 RSUM to a's three seeds: mean 0, SE 0.5 / sqrt(3) = 0.288675 at df 2. Non-superiority
    at Δ = 5: t = -5 / 0.288675 = -17.3205 and at 2 df F(t) = 1/2 + t / (2 sqrt(2 + t^2)) = 0.001656; alone in its
    family (Holm x 1) -> "no effect ≥ Δ on toy"; the upper bound at level 0.05 (t_0.95,2 = 2.919986) is
    0 + 2.919986 x 0.288675 = 0.8429, above 0: not reversed."""
    path = bench_dir / "config" / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["claims"] = [{"claim": "FR helps a", "source": "T2", "better": "a:fr", "worse": "a"}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for seed, gain in enumerate((-0.5, 0.0, 0.5)):
        res = bench_dir / "results" / "toy" / "bench" / "bench" / "a" / f"s{seed}.json"
        d = json.loads(res.read_text())
        d["by_rerank"]["fr"] = result(d["by_rerank"]["none"]["rsum"] + gain, 120)
        res.write_text(json.dumps(d))
    paths = write_benchmark(load_benchmark(path), bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    c = json.loads(paths["json"].read_text())["claims"][0]
    t = -5 / (0.5 / math.sqrt(3))
    assert c["p_non_superiority"] == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-9)  # 0.001656
    assert c["p"] == pytest.approx(0.5) and c["verdict"] == "no effect ≥ Δ on toy"
    assert c["bound_high"] == pytest.approx(2.919986 * 0.5 / math.sqrt(3), abs=1e-5)


def test_one_family_split_across_two_files_is_adjusted_as_one(bench_dir):
    """bench.yaml holds two claims of family `paper`, other.yaml (which reuses bench's runs) the third. Holm runs
    over the three, whichever file's table is written: the numbers of test_tables_and_claims_from_per_seed_results,
    p_ab = 0.00183, p_fr = 0.00457 and p_amb = 0.713 (one-sided) -> 3 p_ab, max(3 p_ab, 2 p_fr) and p_amb; each file
    alone would have given 2 p_ab and max(2 p_ab, p_fr)."""
    cfg = bench_dir / "config" / "benchmark"
    doc = yaml.safe_load((cfg / "bench.yaml").read_text())
    amb = doc["claims"].pop()
    for c in doc["claims"]:
        c["family"] = "paper"
    (cfg / "bench.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    other = {"name": "other", "dataset": "toy", "seeds": [0, 1, 2], "rerank": ["none"], "runs_from": "bench",
             "smallest_effect": {"rsum": 5.0}, "variants": {"a": {"recipe": "a"}, "b": doc["variants"]["b"]},
             "claims": [{**amb, "family": "paper"}]}
    (cfg / "other.yaml").write_text(yaml.safe_dump(other, sort_keys=False))
    out = {}
    for name in ("bench", "other"):
        paths = write_benchmark(load_benchmark(cfg / f"{name}.yaml"), bench_dir / "out", bench_dir / "results",
                                bench_dir / "runs")
        out |= {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    p_ab, p_fr, p_amb = (out[k]["p"] for k in ("a beats b", "FR helps a", "a beats b on ambiguous"))
    assert p_ab == pytest.approx(0.00183, abs=1e-5) and p_fr == pytest.approx((1 - math.sqrt(108 / 110)) / 2)
    assert out["a beats b"]["p_holm"] == pytest.approx(3 * p_ab)
    assert out["FR helps a"]["p_holm"] == pytest.approx(max(3 * p_ab, 2 * p_fr))
    assert out["a beats b on ambiguous"]["p_holm"] == pytest.approx(p_amb) and 0.7 < p_amb < 0.72
    assert {c["family_size"] for c in out.values()} == {3}
    assert out["a beats b on ambiguous"]["family_files"] == "bench other"
    assert "paper (3, with bench, other)" in paths["claims_md"].read_text()
    # b's runs missing: both claims on b (one in each file) count at p = 1, so the family keeps its size: 3 p_fr
    for seed in (0, 1, 2):
        (bench_dir / "results" / "toy" / "bench" / "bench" / "b" / f"s{seed}.json").unlink()
    paths = write_benchmark(load_benchmark(cfg / "bench.yaml"), bench_dir / "out", bench_dir / "results",
                            bench_dir / "runs", strict=False)
    c = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}["FR helps a"]
    assert c["family_size"] == 3 and c["p_holm"] == pytest.approx(3 * p_fr)
    assert "paper (3, with bench, other; 2 not run)" in paths["claims_md"].read_text()


def test_extensions_quote_their_sentence_and_keep_a_family_of_their_own(bench_dir):
    path = bench_dir / "config" / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["claims"][1]["extends"] = "T2 §4: FR helps anything"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"claims\[1\]\.extends must quote the sentence it extends"):
        load_benchmark(path)
    doc["claims"][1]["extends"] = 'T2 §4: "FR has the potential to enhance any model"'
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"family 'all' mixes a paper's stated claims with xmr's extensions"):
        load_benchmark(path)
    doc["claims"][1]["family"] = "t2_extension"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    paths = write_benchmark(load_benchmark(path), bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    row = [line for line in paths["claims_md"].read_text().splitlines() if line.startswith("| FR helps a |")][0]
    assert '| xmr\'s extension of T2 §4: "FR has the potential to enhance any model" |' in row
    fr = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}["FR helps a"]
    assert fr["kind"] == "extension" and fr["family_size"] == 1 and fr["p_holm"] == pytest.approx(fr["p"])


def test_a_claims_primary_metric_can_be_a_dotted_path_into_the_results(bench_dir):
    """`metric: extended.t2i.map_at_r` on subset ambiguous reads subsets.ambiguous.extended.t2i.map_at_r of each
    plain evaluation: a 30, 32, 34 against b 20, 21, 22 -> +11, as RSUM's 302 vs 291 (Welch SE sqrt(5/3))."""
    path = bench_dir / "config" / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["smallest_effect"]["extended.t2i.map_at_r"] = 2.0
    doc["claims"] = [{"claim": "a ranks the true images higher", "source": "T3", "better": "a", "worse": "b",
                      "subset": "ambiguous", "metric": "extended.t2i.map_at_r"},
                     {"claim": "the whole split too", "source": "T3", "better": "a", "worse": "b",
                      "metric": "extended.i2t.r_precision"}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(XmrError, match=r"claims\[1\] compares extended\.i2t\.r_precision, which has no smallest_eff"):
        load_benchmark(path)
    doc["smallest_effect"]["extended.i2t.r_precision"] = 2.0
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    for v, values in (("a", (30, 32, 34)), ("b", (20, 21, 22))):
        for seed, x in enumerate(values):
            res = bench_dir / "results" / "toy" / "bench" / "bench" / v / f"s{seed}.json"
            d = json.loads(res.read_text())
            d["by_rerank"]["none"]["subsets"]["ambiguous"]["extended"] = {"t2i": {"map_at_r": x}}
            res.write_text(json.dumps(d))
    paths = write_benchmark(load_benchmark(path), bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    claims = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    c = claims["a ranks the true images higher"]
    assert c["diff"] == pytest.approx(11.0) and c["se"] == pytest.approx(math.sqrt(5 / 3))
    assert claims["the whole split too"]["verdict"] == "not measured"  # no such number in the results files


def test_a_claim_between_recipes_is_judged_as_contribution_and_as_recipe(bench_dir):
    """b's recipe differs from a's in optim.grad_clip (1.0, declared vsepp's own, not its contribution) and
    optim.weight_decay (0.001, declared its contribution). With `contribution: true` the claim "b beats a" is judged
    twice: contribution, b's recipe with a's grad_clip (variant b_as_a, its runs planned like any other) against a,
    in the claim's family; recipe, b as published, in family all_recipe. b_as_a 310..312 vs a 300..304: +9, Welch
    SE sqrt(5/3), alone in its family -> holds; b 290..292 vs a: -11 -> a gain ruled out, upper bound < 0: reversed."""
    cfg = bench_dir / "config"
    recipe = cfg / "recipes" / "toy" / "b.yaml"
    recipe.write_text(recipe.read_text() + "\noptim: {grad_clip: 1.0, weight_decay: 0.001}\n")
    (cfg / "method_settings.yaml").write_text(yaml.safe_dump({"vsepp": {
        "optim.grad_clip": {"value": 1.0, "source": "its code's --grad_clip 1"},
        "optim.weight_decay": {"value": 0.001, "source": "its paper §3", "contribution": True}}}))
    path = cfg / "benchmark" / "bench.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["contribution"] = True
    doc["claims"] = [{"claim": "b beats a", "source": "T1", "better": "b", "worse": "a"}]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    bench = load_benchmark(path)
    assert bench.variants["b_as_a"]["set"] == {"model.embed_dim": 8, "optim.grad_clip": 2.0}
    assert bench.run_config("b_as_a", 0)["optim"]["weight_decay"] == 0.001  # the contribution stays
    for seed, rsum in enumerate((310, 311, 312)):
        res = bench_dir / "results" / "toy" / "bench" / "bench" / "b_as_a" / f"s{seed}.json"
        res.parent.mkdir(parents=True, exist_ok=True)
        res.write_text(json.dumps({"by_rerank": {"none": result(rsum, 120), "fr": result(rsum, 120)}}))
    r = run_xmr("benchmark-table", "--benchmark", path, "--results-root", bench_dir / "results", "--runs-root",
                bench_dir / "runs", "--out-dir", bench_dir / "out", cwd=bench_dir)
    assert r.returncode == 0, r.stderr
    rows = {(c["claim"], c["judged"]): c for c in json.loads((bench_dir / "out" / "bench.json").read_text())["claims"]}
    contribution, recipe = rows[("b beats a", "contribution")], rows[("b beats a", "recipe")]
    assert contribution["better"] == "b_as_a" and contribution["family"] == "all" and recipe["family"] == "all_recipe"
    assert contribution["diff"] == pytest.approx(9.0) and contribution["se"] == pytest.approx(math.sqrt(5 / 3))
    assert contribution["p_holm"] == pytest.approx(contribution["p"]) and contribution["verdict"] == "holds on toy"
    assert recipe["diff"] == pytest.approx(-11.0) and recipe["verdict"] == "reversed on toy"
    md = (bench_dir / "out" / "bench_claims.md").read_text()
    assert "| b beats a (contribution) | T1 | `b_as_a` vs `a` |" in md and "| b beats a (recipe) | T1 | `b` vs `a` |" in md
