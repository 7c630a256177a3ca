"""Experiments as data (xmr/studies/experiments.py): validation, variant resolution, targets, the experiment table."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from xmr.core.errors import XmrError
from xmr.studies.experiments import format_value, load_experiment, resolve_variant

from conftest import toy_config

REPO = Path(__file__).resolve().parents[1]


def write_experiment(config_dir: Path, doc: dict) -> Path:
    path = config_dir / "experiments" / f"{doc['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


BASE = {"name": "exp_a", "dataset": "synth", "recipe": "vsepp", "rerank": ["none", "fr"],
        "variants": {"full": {}}}


@pytest.mark.parametrize("change, key", [
    ({"rerank": None}, "missing required key 'rerank'"),
    ({"variantz": {}}, "variantz"),
    ({"sweep": {"key": "loss.margin", "values": ["a"]}}, "sweep.values.0"),
    ({"sweep": {"values": [1]}}, "missing required key 'sweep.key'"),
    ({"rerank": ["none", "frr"]}, "rerank: unknown re-ranker 'frr'"),
    ({"name": "other"}, "name: 'other' must equal the file name"),
    ({"recipe": None}, "missing required key 'recipe'"),
    ({"recipe": None, "variants": None, "recipes": ["vsepp"], "overrides": {"train.epochs": 1}}, "overrides"),
    ({"variants": {"full_fr": {}}}, "variant 'full_fr' ends in a re-ranker suffix"),
    ({"dataset": "Synth"}, "dataset"),
])
def test_validation_errors_name_the_key(tmp_path, change, key):
    doc = {k: v for k, v in ({**BASE, **change}).items() if v is not None}
    stem = BASE["name"]
    path = tmp_path / "config" / "experiments" / f"{stem}.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError) as e:
        load_experiment(path)
    assert key in str(e.value)
    assert str(path) in str(e.value)


def test_repository_experiments_load_and_resolve():
    """Every shipped experiment file is valid, and every variant's overrides name real config keys."""
    from xmr.studies.experiments import list_experiments

    exps = {e.name: e for e in list_experiments(REPO / "config")}
    assert {"dvse_ablation", "dvse_k_sweep", "dvse_beta_sweep", "dvse_eta_sweep", "fr_all_methods"} <= set(exps)
    k = exps["dvse_k_sweep"]
    assert list(k.variants) == ["k_1", "k_2", "k_4", "k_6", "k_8", "k_10", "k_12"]
    for exp in exps.values():
        if exp.kind != "variants":
            continue
        for v in exp.variants:
            cfg = resolve_variant(exp, v, exp.datasets[0], REPO / "config")  # the first dataset it is meant for
            for key, value in exp.overrides_of(v).items():
                node = cfg
                for part in key.split("."):
                    node = node[part]
                assert node == value, (exp.name, v, key)


def test_format_value():
    assert [format_value(v) for v in (0.2, 1.0, 12, -0.5, 1e-3)] == ["0p2", "1", "12", "m0p5", "0p001"]


def test_variant_resolution_applies_overrides(tiny_synth):
    from xmr.run.config import load_run_config

    recipe = tiny_synth.recipe("vsepp", "exp_vsepp", train={"epochs": 3})
    exp_path = write_experiment(tiny_synth.config_dir, {
        "name": "exp_resolve", "dataset": "synth", "recipe": "exp_vsepp", "rerank": ["none"],
        "overrides": {"train.epochs": 1, "loss.margin": 0.3},
        "sweep": {"key": "model.embed_dim", "values": [16, 24], "prefix": "d"},
        "variants": {"small_margin": {"loss.margin": 0.05, "loss.max_violation": False}},
    })
    exp = load_experiment(exp_path)
    assert exp.config_dir == tiny_synth.config_dir
    assert list(exp.variants) == ["d_16", "d_24", "small_margin"]
    assert exp.sweep_value("d_24") == 24 and exp.sweep_value("small_margin") is None
    base = load_run_config(recipe)
    cfg = resolve_variant(exp, "d_24")
    assert cfg["model"]["embed_dim"] == 24 and base["model"]["embed_dim"] == 32
    assert cfg["train"]["epochs"] == 1 and cfg["loss"]["margin"] == 0.3  # common overrides
    assert cfg["name"] == "exp_resolve.d_24"
    cfg = resolve_variant(exp, "small_margin", extra=["train.batch_size=8"])
    assert cfg["loss"]["margin"] == 0.05  # the variant wins over the common override
    assert cfg["loss"]["max_violation"] is False and base["loss"]["max_violation"] is True
    assert cfg["train"]["batch_size"] == 8 and cfg["model"]["embed_dim"] == 32
    # everything not overridden is the recipe's
    same = {k: v for k, v in cfg["optim"].items()}
    assert same == base["optim"]

    bad = write_experiment(tiny_synth.config_dir, {
        "name": "exp_badkey", "dataset": "synth", "recipe": "exp_vsepp", "rerank": ["none"],
        "variants": {"a": {"model.embed_dimm": 8}}})
    with pytest.raises(XmrError, match=r"variants\.a: key 'model\.embed_dimm' is not in the resolved config"):
        resolve_variant(load_experiment(bad), "a")
    with pytest.raises(XmrError, match="dataset: experiment 'exp_badkey' is for synth, not 'coco'"):
        resolve_variant(load_experiment(bad), "a", "coco")


def test_targets_and_parse_target(tmp_path):
    path = write_experiment(tmp_path / "config", {**BASE, "name": "exp_t", "sweep": {"key": "model.num_embeds",
                                                                                      "values": [1, 2]}})
    exp = load_experiment(path)
    assert exp.parse_target("num_embeds_2_fr") == ("num_embeds_2", "fr")
    assert exp.parse_target("full") == ("full", None)
    with pytest.raises(XmrError, match="no variant/re-ranker target 'full_rr'"):
        exp.parse_target("full_rr")  # rr is not one of this experiment's re-rankers
    got = [(v, r, str(p)) for v, r, p in exp.targets("synth", "res")]
    assert got[:3] == [("num_embeds_1", "none", "res/synth/exp/exp_t/num_embeds_1.json"),
                       ("num_embeds_1", "fr", "res/synth/exp/exp_t/num_embeds_1_fr.json"),
                       ("num_embeds_2", "none", "res/synth/exp/exp_t/num_embeds_2.json")]
    assert str(exp.run_dir("synth", "full", "rr_root")) == "rr_root/synth/exp/exp_t/full"
    # a comparison of recipes points at the ordinary targets, and leaves out recipes the dataset lacks
    (tmp_path / "config" / "recipes" / "synth").mkdir(parents=True)
    (tmp_path / "config" / "recipes" / "synth" / "vsepp.yaml").write_text("{}")
    cmp = load_experiment(write_experiment(tmp_path / "config", {
        "name": "cmp", "dataset": "synth", "recipes": ["vsepp", "dvse"], "rerank": ["none", "csls"]}))
    assert [(v, r, str(p)) for v, r, p in cmp.targets("synth", "res")] == [
        ("vsepp", "none", "res/synth/vsepp.json"), ("vsepp", "csls", "res/synth/vsepp_csls.json")]


def _result(path: Path, recipe: str, rerank: str, i2t: list[float], t2i: list[float], rsum: float,
            map_at_r: tuple[float, float] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    metrics = {"i2t": dict(zip(["r1", "r5", "r10"], i2t)), "t2i": dict(zip(["r1", "r5", "r10"], t2i)), "rsum": rsum}
    if map_at_r:  # mAP@R over extended positives (synth's scene-checked ones)
        metrics["extended"] = {"positives": "synth_scenes", "i2t": {"map_at_r": map_at_r[0]},
                               "t2i": {"map_at_r": map_at_r[1]}}
    path.write_text(json.dumps({**metrics, "protocol": "plain", "protocols": {"plain": metrics}, "dataset": "synth",
                                "recipe": recipe, "method": "dvse", "rerank": rerank, "best_epoch": 1}))


def test_experiment_table_from_fabricated_results(tmp_path):
    from xmr.report.experiment_table import write_experiment_table

    cfg_dir, results, runs = tmp_path / "config", tmp_path / "results", tmp_path / "runs"
    exp = load_experiment(write_experiment(cfg_dir, {
        "name": "kk", "dataset": "synth", "recipe": "dvse", "rerank": ["none", "fr"],
        "sweep": {"key": "model.num_embeds", "values": [1, 4], "prefix": "k", "label": "K"},
        "variants": {"no_mask": {"model.dynamic_mask.enabled": False}}}))
    d = results / "synth" / "exp" / "kk"
    _result(d / "k_1.json", "kk.k_1", "none", [10.0, 30.0, 50.0], [5.0, 20.0, 40.0], 155.0, (11.14, 22.25))
    _result(d / "k_1_fr.json", "kk.k_1", "fr", [12.0, 33.0, 52.0], [6.0, 21.0, 41.0], 165.0)
    _result(d / "k_4.json", "kk.k_4", "none", [20.0, 40.0, 60.0], [8.0, 25.0, 45.0], 198.0)
    _result(d / "no_mask.json", "kk.no_mask", "none", [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], 21.0)
    (runs / "synth" / "exp" / "kk" / "k_4").mkdir(parents=True)
    (runs / "synth" / "exp" / "kk" / "k_4" / "train.json").write_text(json.dumps({"train_seconds": 90.0}))

    out = write_experiment_table(exp, "synth", results_root=results, runs_root=runs, config_dir=cfg_dir)
    assert sorted(out["missing"]) == sorted([str(d / "k_4_fr.json"), str(d / "no_mask_fr.json")])
    rows = list(csv.DictReader(io.StringIO((d / "table.csv").read_text())))
    assert [(r["variant"], r["rerank"], r["value"]) for r in rows] == [
        ("k_1", "none", "1"), ("k_1", "fr", "1"), ("k_4", "none", "4"), ("no_mask", "none", "")]
    assert [float(rows[1][c]) for c in ("i2t R@1", "t2i R@10", "RSUM")] == [12.0, 41.0, 165.0]
    assert rows[2]["train (min)"] == "1.5" and rows[0]["train (min)"] == ""

    md = (d / "table.md").read_text().splitlines()
    header = next(line for line in md if line.startswith("| variant"))
    assert header == ("| variant | K | changes | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | "
                      "RSUM | i2t mAP@R (ext.) | t2i mAP@R (ext.) | RSUM (fr) | train (min) |")
    body = [line for line in md if line.startswith("| k_") or line.startswith("| no_mask")]
    assert body == [
        "| k_1 | 1 | model.num_embeds=1 | 10.0 | 30.0 | 50.0 | 5.0 | 20.0 | 40.0 | 155.0 | 11.1 | 22.2 | 165.0 | — |",
        "| k_4 | 4 | model.num_embeds=4 | 20.0 | 40.0 | 60.0 | 8.0 | 25.0 | 45.0 | 198.0 | — | — | — | 1.5 |",
        "| no_mask | — | model.dynamic_mask.enabled=false | 1.0 | 2.0 | 3.0 | 4.0 | 5.0 | 6.0 | 21.0 | — | — | — | — |",
    ]
    assert "Not available yet (2 results files)" in "\n".join(md)
    assert any(line.startswith("Measured on the synth test split") for line in md)  # every table names its split
    assert (d / "figure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_experiment_table_reports_no_results(tmp_path):
    from xmr.report.experiment_table import write_experiment_table

    exp = load_experiment(write_experiment(tmp_path / "config", {**BASE, "name": "empty"}))
    with pytest.raises(XmrError, match="experiment empty: no results on synth yet"):
        write_experiment_table(exp, "synth", results_root=tmp_path / "results", runs_root=tmp_path / "runs")


def test_train_cli_trains_a_variant(tiny_synth, tmp_path):
    from xmr.cli import main
    from xmr.config.loader import load_yaml

    tiny_synth.recipe("vsepp", "exp_cli_vsepp")
    exp_path = write_experiment(tiny_synth.config_dir, {
        "name": "exp_cli", "dataset": "synth", "recipe": "exp_cli_vsepp", "rerank": ["none"],
        "variants": {"wide": {"model.embed_dim": 24}}})
    out = tmp_path / "run"
    assert main(["train", "--experiment", str(exp_path), "--variant", "wide", "--out-dir", str(out),
                 "--no-progress"]) == 0
    cfg = load_yaml(out / "config.yaml")
    assert cfg["model"]["embed_dim"] == 24 and cfg["name"] == "exp_cli.wide"
    assert (out / "best.pt").exists()
    assert main(["train", "--experiment", str(exp_path), "--out-dir", str(out)]) == 2  # no --variant


def test_a_ladder_table_says_what_each_rung_adds_to_the_one_before():
    """`ladder: true`: each rung's changes are the settings on which its resolved run config differs from the rung
    before (here read off config/experiments/dvse_ladder.yaml and config/methods/dvse.yaml by hand)."""
    from xmr.report.experiment_table import changes_text

    exp = load_experiment("dvse_ladder")
    assert exp.doc["ladder"] and list(exp.variants)[:3] == ["base", "layer_norm", "caption_residual"]
    assert changes_text(exp, "layer_norm", "synth") == 'model.layer_norm: "none" → "per_term"'  # the method file's
    assert changes_text(exp, "sets", "synth") == "model.attention: false → true; model.num_embeds: 1 → 6"
    assert changes_text(exp, "l_var", "synth") == 'loss.eta: 1.0 → 0.6; loss.ranking: "triplet_set" → "variance_aware"'
    assert changes_text(exp, "full", "synth") == "model.dynamic_mask.enabled: false → true"
    # the first rung is the base: its own overrides
    assert changes_text(exp, "base", "synth").startswith("model.attention=false, model.num_embeds=1")
    # without `ladder`, each variant is described by its own overrides
    plain = load_experiment("dvse_ablation")
    assert changes_text(plain, "no_dm", "synth") == "model.dynamic_mask.enabled=false"


# ------------------------------------------------------------------------------ runs_from: a benchmark's run, reused

def _toy_bench_and_experiment(tmp_path: Path, variants: dict, seeds=(0, 1)) -> Path:
    """config/ with a toy recipe `a` (VSE++ at embed 8), a benchmark `bench` of it, and an experiment with
    ``runs_from: [bench]``; returns the experiment file."""
    cfg = toy_config(tmp_path)
    (cfg / "benchmark").mkdir()
    (cfg / "benchmark" / "bench.yaml").write_text(yaml.safe_dump({
        "name": "bench", "dataset": "toy", "seeds": list(seeds), "rerank": ["none"], "smallest_effect": {"rsum": 5.0},
        "overrides": {"train.threads": 1},
        "variants": {"plain": {"recipe": "a"}, "margin": {"recipe": "a", "set": {"loss.margin": 0.1}}}},
        sort_keys=False))
    return write_experiment(cfg, {"name": "lad", "dataset": "toy", "recipe": "a", "rerank": ["none", "fr"],
                                  "runs_from": ["bench"], "overrides": {"train.threads": 1}, "variants": variants})


def test_runs_from_reuses_a_benchmark_run_only_when_the_run_config_is_the_same(tmp_path):
    path = _toy_bench_and_experiment(tmp_path, {
        "same": {},                                  # = bench's `plain` at seed 0 (the recipe's seed)
        "same_margin": {"loss.margin": 0.1},         # = bench's `margin` at seed 0
        "other_margin": {"loss.margin": 0.3},        # no benchmark variant trains this
        "seed_1": {"train.seed": 1},                 # overrides differ from `plain`'s: trained as its own run
    })
    exp = load_experiment(path)
    assert {v: k.run for v, k in exp.shared_runs("toy").items()} == {
        "same": "bench/bench/plain/s0", "same_margin": "bench/bench/margin/s0"}
    assert str(exp.run_dir("toy", "same")) == "runs/toy/bench/bench/plain/s0"           # trained once, there
    assert str(exp.run_dir("toy", "other_margin")) == "runs/toy/exp/lad/other_margin"
    # the results stay the experiment's own files, evaluated from the reused run
    assert str(exp.result_path("toy", "same", "fr")) == "results/toy/exp/lad/same_fr.json"


def test_runs_from_does_not_reuse_a_run_of_a_seed_the_benchmark_lacks(tmp_path):
    exp = load_experiment(_toy_bench_and_experiment(tmp_path, {"same": {}}, seeds=(1, 2)))
    assert exp.shared_runs("toy") == {}  # the recipe trains seed 0; the benchmark has no seed-0 run


def test_runs_from_must_name_a_benchmark(tmp_path):
    path = _toy_bench_and_experiment(tmp_path, {"same": {}})
    doc = yaml.safe_load(path.read_text())
    doc["runs_from"] = ["bnech"]
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError, match=r"lad\.yaml: runs_from: no benchmark 'bnech' .*benchmarks: bench\)"):
        load_experiment(path)


def test_the_ladders_reuse_the_benchmark_runs_they_would_duplicate():
    """By hand from the files: each ladder's `full` rung is its recipe under the benchmark's overrides, seed 0, which
    is that benchmark variant's s0; DVSE's `l_ort` (no mask) and `l_var` (no mask, no L_ort) are dvse_sets's
    dvse_no_dm and dvse_no_dm_no_ort; no other rung trains a benchmark's run."""
    from xmr.planning.workflow_inputs import parse_result

    expected = {"dvse_ladder": {"full": "bench/benchmark/dvse/s0", "l_ort": "bench/dvse_sets/dvse_no_dm/s0",
                                "l_var": "bench/dvse_sets/dvse_no_dm_no_ort/s0"},
                "dive_ladder": {"full": "bench/benchmark/dive/s0"},
                "coder_ladder": {"full": "bench/benchmark/coder/s0"},
                "vse_2ad_ladder": {"full": "bench/benchmark/vse_2ad/s0"},
                "dvse_base_ladder": {}}
    for name, runs in expected.items():
        exp = load_experiment(name)
        assert {v: k.run for v, k in exp.shared_runs("synth").items()} == runs, name
    # the workflow's results target of a reused rung evaluates the benchmark's run
    key, rerank = parse_result("synth", "exp/dvse_ladder/l_ort_fr")
    assert (key.run, rerank) == ("bench/dvse_sets/dvse_no_dm/s0", ["fr"])


def test_snakemake_evaluates_a_reused_rung_from_the_benchmark_run():
    """The command: the ladder's results file of a reused rung is `xmr test` on the benchmark's run directory, and
    no training of the rung's own run is planned."""
    import subprocess
    import sys

    snakemake = str(Path(sys.executable).parent / "snakemake")
    r = subprocess.run([snakemake, "-n", "-p", "--nolock", "-c1", "-f", "results/synth/exp/vse_2ad_ladder/full.json"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout + r.stderr
    assert "-m xmr test --run runs/synth/bench/benchmark/vse_2ad/s0 " in out
    assert "exp/vse_2ad_ladder/full/" not in out  # no run directory of the rung's own
