"""The seeded benchmark: statistics of a difference (worked by hand), verdicts, gathering per-seed results files
into tables and claims, and the file's validation."""

import json
import math

import pytest
import yaml

from xmr.benchmark import compare, load_benchmark, mean_std, verdict, write_benchmark
from xmr.errors import XmrError


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


def test_verdicts_at_two_standard_errors():
    assert verdict(3.0, 1.29) == "holds"            # 3 > 2.58
    assert verdict(1.0, 1.633) == "inconclusive"    # |1| < 3.27
    assert verdict(-3.0, 0.816) == "does not hold"  # -3 < -1.63
    assert verdict(2.0, 1.0) == "inconclusive"      # exactly 2 SE is not more than 2 SE
    assert verdict(1.0, float("nan")) == "inconclusive"


def result(rsum_all: float, rsum_amb: float) -> dict:
    """A results dict whose six recalls add up to the given RSUMs (i2t R@1 carries the difference)."""
    def part(rsum):
        return {"i2t": {"r1": rsum - 250, "r5": 50, "r10": 50, "medr": 1, "meanr": 1},
                "t2i": {"r1": 50, "r5": 50, "r10": 50, "medr": 1, "meanr": 1}, "rsum": rsum}
    return {**part(rsum_all), "subsets": {"ambiguous": {**part(rsum_amb), "n_images": 3, "n_captions": 3}}}


@pytest.fixture
def bench_dir(tmp_path):
    cfg = tmp_path / "config"
    (cfg / "recipes" / "toy").mkdir(parents=True)
    for r in ("a", "b"):
        (cfg / "recipes" / "toy" / f"{r}.yaml").write_text("method: vsepp\n")
    (cfg / "benchmark").mkdir()
    doc = {"name": "bench", "dataset": "toy", "seeds": [0, 1, 2], "rerank": ["none", "fr"],
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
    return tmp_path


def test_tables_and_claims_from_per_seed_results(bench_dir):
    bench = load_benchmark(bench_dir / "config" / "benchmark" / "bench.yaml")
    assert bench.train_overrides("b", 2) == ['model.embed_dim=8', 'train.seed=2', 'name="bench.b.s2"']
    paths = write_benchmark(bench, bench_dir / "out", bench_dir / "results", bench_dir / "runs")
    claims = {c["claim"]: c for c in json.loads(paths["json"].read_text())["claims"]}
    # a: 302 ± 2, b: 291 ± 1 -> diff 11, Welch SE sqrt(4/3 + 1/3) = 1.29 -> holds
    c = claims["a beats b"]
    assert (c["better_mean"], c["better_std"], c["worse_mean"], c["worse_std"]) == pytest.approx((302, 2, 291, 1))
    assert c["se"] == pytest.approx(math.sqrt(5 / 3)) and c["verdict"] == "holds" and not c["paired"]
    # FR on a: paired differences 5, 6, 7 -> 6 ± 1 / sqrt(3)
    c = claims["FR helps a"]
    assert c["paired"] and c["diff"] == pytest.approx(6.0) and c["se"] == pytest.approx(1 / math.sqrt(3))
    # ambiguous: a 120 ± 20 vs b 130 ± 20 -> -10, SE sqrt(400/3 * 2) = 16.3 -> inconclusive
    c = claims["a beats b on ambiguous"]
    assert c["diff"] == pytest.approx(-10.0) and c["verdict"] == "inconclusive"
    md = paths["md"].read_text()
    assert "| a | 52.0 ± 2.0 | 50.0 ± 0.0 |" in md  # i2t R@1 = RSUM - 250
    assert "302.0 ± 2.0" in md and "subset `ambiguous`" in md
    assert "**holds**" in paths["claims_md"].read_text()
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
    assert claims["FR helps a"]["verdict"] == "holds"  # both sides present
    assert "3 of 6 runs have no results yet** (b/s0, b/s1, b/s2)" in paths["md"].read_text()
