"""The run key (xmr.run.layout.RunKey): every kind of run has one path grammar, read back by the same module, and the
workflow's inputs and job requests come from it alike for recipes, experiment variants and benchmark variants."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from xmr.core.errors import XmrError
from xmr.planning.jobs import extract_workers, train_job
from xmr.planning.workflow_inputs import (feature_dirs, image_inputs, parse_result, rerank_inputs, rerank_options,
                                          run_config, run_config_files, run_inputs, text_feature_files)
from xmr.run.layout import RUN_PATTERN, RunKey, result_pattern

REPO = Path(__file__).resolve().parents[1]

KEYS = [
    (RunKey.recipe("synth", "dvse"), "dvse", "runs/synth/dvse", "results/synth/dvse_fr.json"),
    (RunKey.experiment("synth", "dvse_k_sweep", "k_1"), "exp/dvse_k_sweep/k_1",
     "runs/synth/exp/dvse_k_sweep/k_1", "results/synth/exp/dvse_k_sweep/k_1_fr.json"),
    (RunKey.benchmark("synth", "benchmark", "dvse", 2), "bench/benchmark/dvse/s2",
     "runs/synth/bench/benchmark/dvse/s2", "results/synth/bench/benchmark/dvse/s2.json"),
]


@pytest.mark.parametrize("key,run,run_dir,fr_result", KEYS)
def test_run_key_paths_round_trip(key, run, run_dir, fr_result):
    assert key.run == run
    assert re.fullmatch(RUN_PATTERN, run)
    assert key.run_dir().as_posix() == run_dir
    assert key.result_path("fr").as_posix() == fr_result
    assert RunKey.parse_run("synth", run) == key
    assert RunKey.from_run_dir(run_dir) == key
    assert RunKey.from_run_dir(Path.cwd() / run_dir) == key  # absolute paths below the working directory too


def test_plain_results_and_the_benchmark_file():
    assert RunKey.recipe("synth", "dvse").result_path().as_posix() == "results/synth/dvse.json"
    assert RunKey.recipe("synth", "dvse").result_path("none").as_posix() == "results/synth/dvse.json"
    # one file per benchmark run, whatever the re-ranker
    key = RunKey.benchmark("synth", "benchmark", "dvse", 0)
    assert key.result_path("fr") == key.result_path() == Path("results/synth/bench/benchmark/dvse/s0.json")


def test_bad_run_keys_are_one_line_errors():
    with pytest.raises(XmrError, match="not a run directory of this layout"):
        RunKey.parse_run("synth", "bench/benchmark/dvse")
    with pytest.raises(XmrError, match="not under runs/"):
        RunKey.from_run_dir("/elsewhere/synth/dvse")
    with pytest.raises(XmrError, match="run kind 'sweep'"):
        RunKey("synth", "x", "sweep")
    with pytest.raises(XmrError, match="a benchmark a variant and a seed"):
        RunKey("synth", "benchmark", "benchmark", "dvse")


def test_results_targets_parse_back_to_their_run(monkeypatch):
    monkeypatch.chdir(REPO)
    assert parse_result("synth", "dvse_fr") == (RunKey.recipe("synth", "dvse"), ["fr"])
    assert parse_result("synth", "dvse") == (RunKey.recipe("synth", "dvse"), ["none"])
    assert parse_result("synth", "exp/dvse_k_sweep/k_1") == (RunKey.experiment("synth", "dvse_k_sweep", "k_1"),
                                                              ["none"])
    key, rerankers = parse_result("synth", "bench/benchmark/dvse/s1")
    assert key == RunKey.benchmark("synth", "benchmark", "dvse", 1)
    assert rerankers == yaml.safe_load((REPO / "config/benchmark/benchmark.yaml").read_text())["rerank"]
    with pytest.raises(XmrError, match="not a results target"):
        parse_result("synth", "bench/benchmark/dvse")
    # dataset-level tables are other rules' outputs, never a run's results
    pattern = result_pattern()
    assert not re.fullmatch(pattern, "summary") and not re.fullmatch(pattern, "benchmark")
    assert re.fullmatch(pattern, "dvse_fr") and re.fullmatch(pattern, "summary_v2")


def test_each_kind_resolves_the_config_its_source_says(monkeypatch):
    monkeypatch.chdir(REPO)
    recipe = run_config(RunKey.recipe("synth", "dvse"))
    variant = run_config(RunKey.experiment("synth", "dvse_k_sweep", "k_1"))
    bench = run_config(RunKey.benchmark("synth", "dvse_sets", "dvse_no_dm", 2))
    assert recipe["model"]["num_embeds"] != 1 and variant["model"]["num_embeds"] == 1  # the sweep's value
    assert bench["train"]["seed"] == 2 and bench["model"]["dynamic_mask"]["enabled"] is False
    assert bench["train"]["threads"] == 1  # the benchmark's common override
    assert run_config(RunKey.recipe("synth", "dvse"), ["train.epochs=2"])["train"]["epochs"] == 2
    assert run_config_files(RunKey.benchmark("synth", "benchmark", "dvse", 0)) == [
        "config/recipes/synth/dvse.yaml", "config/benchmark/benchmark.yaml"]
    with pytest.raises(XmrError, match="no recipe for results/synth/nope.json"):
        run_config(RunKey.recipe("synth", "nope"))


def test_inputs_honour_features_dir_source_and_text_features_for_every_kind(monkeypatch):
    monkeypatch.chdir(REPO)
    for key in (RunKey.recipe("synth", "dvse"), RunKey.experiment("synth", "dvse_k_sweep", "k_1"),
                RunKey.benchmark("synth", "benchmark", "dvse", 0)):
        cfg = run_config(key, ["features.dir=/scratch/feats"])
        files = run_inputs(key, "train", cfg=cfg)
        assert files["images"] == [f"/scratch/feats/synth/{cfg['features']['backbone']}/{s}.h5" for s in ("train", "val")]
        assert run_inputs(key, "score", cfg=cfg)["images"] == [
            f"/scratch/feats/synth/{cfg['features']['backbone']}/test.h5"]
        assert files["config"] == run_config_files(key)
        e2e = run_config(key, ["features.source=images"])
        assert run_inputs(key, "train", cfg=e2e)["images"] == [cfg["dataset_cfg"]["annotations"]]
    # precomputed text features (RRF's HGLMM): a benchmark variant needs them as its recipe does
    rrf = run_config(RunKey.benchmark("synth", "baselines", "rrf_baseline", 0))
    assert run_inputs(RunKey.benchmark("synth", "baselines", "rrf_baseline", 0), "train", cfg=rrf)[
        "text_features"] == text_feature_files(rrf)["train"] == ["features/synth/hglmm/train.h5",
                                                                   "features/synth/hglmm/val.h5"]
    assert image_inputs("synth", {"source": "images", "annotations": ["a.json", "b.json"]}, ["train"]) == [
        "a.json", "b.json"]


def test_feature_dirs_lists_what_recipes_name(tmp_path):
    (tmp_path / "recipes" / "synth").mkdir(parents=True)
    (tmp_path / "methods").mkdir()
    (tmp_path / "recipes" / "synth" / "a.yaml").write_text("features: {dir: /scratch/f/}\n")
    (tmp_path / "recipes" / "synth" / "b.yaml").write_text("model: {embed_dim: 4}\n")
    (tmp_path / "methods" / "m.yaml").write_text("features: {dir: feats2}\n")
    assert feature_dirs(tmp_path) == ["/scratch/f", "feats2", "features"]


def test_one_training_job_request_for_every_kind():
    resources = yaml.safe_load((REPO / "config/config.yaml").read_text())["resources"]
    one = train_job(resources, "synth")
    assert one["launch"] == "" and one["mpi"] is None and one["gpu"] == 0
    resources["synth"]["train"]["gpu"] = 2
    two = train_job(resources, "synth")
    assert two["launch"] == " --nproc-per-node 2 --nnodes 1"
    assert (two["gpu"], two["tasks"], two["tasks_per_gpu"], two["mpi"], two["nodes"]) == (2, 2, 1, "srun", 1)
    resources["synth"]["train"]["nodes"] = 3
    three = train_job(resources, "synth", threads=1)
    assert three["launch"] == " --nproc-per-node 2 --nnodes 3"
    assert (three["gpu"], three["gres"], three["tasks"], three["cpus_per_task"]) == (None, "gpu:2", 6, 1)


def test_extraction_decodes_on_all_but_the_main_processs_cpu():
    # 1 CPU: no worker process (decoding inline); a GPU node's 8: 7 decoders beside the process feeding the GPU;
    # a hand run on a large node without an allocation: at most 16
    assert [extract_workers(c) for c in (1, 2, 8, 17, 64)] == [0, 1, 7, 16, 16]


def test_a_rerankers_extra_inputs_come_from_its_spec():
    from xmr.rerank import RERANKERS

    assert dict(RERANKERS.get("qbnorm").run_inputs) == {"bank_i2t": "qbnorm_bank_i2t.npy",
                                                        "bank_t2i": "qbnorm_bank_t2i.npy"}
    assert rerank_inputs("runs/synth/x", "fr") == {}
    assert rerank_inputs("runs/synth/x", "qbnorm") == {"bank_i2t": "runs/synth/x/qbnorm_bank_i2t.npy",
                                                       "bank_t2i": "runs/synth/x/qbnorm_bank_t2i.npy"}
    assert rerank_options("r", ["none", "fr", "rr"]) == "--reranks none fr rr"
    assert rerank_options("r", ["none"]) == "" == rerank_options("r", None)
    with pytest.raises(XmrError, match="evaluate it in a results file of its own"):
        rerank_options("r", ["fr", "qbnorm"])


def test_after_failure_names_each_failed_jobs_error_line(tmp_path):
    """The workflow's onerror handler (xmr.planning.workflow_inputs.after_failure): for each job Snakemake's
    scheduler holds as failed, the xmr error line of its log, or, without one (a killed process, a shell's message),
    its last line."""
    from types import SimpleNamespace

    from xmr.planning.workflow_inputs import AFTER_FAILURE, after_failure

    logs = {"extract": "loading\nxmr extract: error: data/x/images/a.png: image not found\n\n",
            "train": "epoch 1/30 loss=1.0\nepoch 2/30 loss=0.9\n"}
    for name, text in logs.items():
        (tmp_path / f"{name}.log").write_text(text)
    failed = [SimpleNamespace(rule=SimpleNamespace(name="extract"), log=[str(tmp_path / "extract.log")]),
              # the training's log is its `log` parameter (appended to; Snakemake deletes a `log:` before a run)
              SimpleNamespace(rule=SimpleNamespace(name="train"), log=[],
                              params=SimpleNamespace(log=str(tmp_path / "train.log"))),
              SimpleNamespace(rule=SimpleNamespace(name="score"), log=[str(tmp_path / "never.log")])]  # no log
    workflow = SimpleNamespace(scheduler=SimpleNamespace(failed=failed))
    assert sorted(after_failure(workflow).splitlines()) == sorted([
        f"rule extract ({tmp_path}/extract.log): xmr extract: error: data/x/images/a.png: image not found",
        f"rule train ({tmp_path}/train.log): its last line: epoch 2/30 loss=0.9", AFTER_FAILURE])
    assert after_failure(SimpleNamespace()) == AFTER_FAILURE  # no scheduler (a failure before any job ran)
