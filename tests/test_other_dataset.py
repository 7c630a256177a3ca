"""`xmr score --dataset` / `xmr test --dataset`: a trained run evaluated on another dataset's test split (synth's
development split synth_dev, docs/benchmark.md "Splits"; a transfer test such as COCO -> Flickr30K), as the docs
print the commands, on a tiny synth run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

import xmr
from conftest import run_xmr


@pytest.fixture
def other_datasets(tiny_synth, tmp_path):
    """A config folder (the working folder of the commands) with tiny synth and two more datasets: ``synth_copy``,
    synth's own files under another name, and ``synth_dev``, synth's generator with test images of their own
    (``test_seed``), generated and extracted by the commands a user runs. Their features go where the run reads
    them, ``{features.dir}/{dataset}/{backbone}/``, and are removed at the end."""
    cfg_dir = tiny_synth.dataset_config_dir(tmp_path)
    shutil.copy(tiny_synth.config_dir / "backbones.yaml", cfg_dir / "backbones.yaml")
    synth = yaml.safe_load((cfg_dir / "datasets" / "synth.yaml").read_text())
    (cfg_dir / "datasets" / "synth_copy.yaml").write_text(yaml.safe_dump({**synth, "name": "synth_copy"}))
    dev_root = tmp_path / "data" / "synth_dev"
    dev = {**synth, "name": "synth_dev", "root": str(dev_root), "annotations": str(dev_root / "dataset_synth.json"),
           "images": str(dev_root / "images"), "generate": {**synth["generate"], "test_seed": 7}}
    (cfg_dir / "datasets" / "synth_dev.yaml").write_text(yaml.safe_dump(dev))
    copy_feats = tiny_synth.features_dir / "synth_copy" / "efficientnet_lite0"
    dev_feats = tiny_synth.features_dir / "synth_dev" / "efficientnet_lite0"
    copy_feats.mkdir(parents=True)
    shutil.copy(tiny_synth.features_dir / "synth" / "efficientnet_lite0" / "test.h5", copy_feats / "test.h5")
    try:
        run_xmr("synth", "--dataset", "synth_dev", "--out", dev_root, cwd=tmp_path, check=True)
        run_xmr("extract", "--dataset", "synth_dev", "--backbone", "efficientnet_lite0", "--split", "test",
                "--out", dev_feats / "test.h5", "--no-progress", cwd=tmp_path, check=True)
        yield tmp_path
    finally:
        shutil.rmtree(copy_feats.parent, ignore_errors=True)
        shutil.rmtree(dev_feats.parent, ignore_errors=True)


def test_a_run_scored_and_tested_on_another_datasets_test_split(tiny_synth_run, other_datasets, monkeypatch):
    cwd, run = other_datasets, tiny_synth_run
    run_xmr("score", "--run", run, "--out", cwd / "own.npy", cwd=cwd, check=True)
    gallery = run / "gallery_test.npz"
    before = gallery.stat().st_mtime_ns
    copy = run_xmr("score", "--run", run, "--dataset", "synth_copy", "--out", cwd / "copy.npy", cwd=cwd, check=True)
    assert "synth_copy split test" in copy.stdout, copy.stdout
    # the same images and captions under another name: the same model gives the same matrix, bit for bit
    np.testing.assert_array_equal(np.load(cwd / "copy.npy"), np.load(cwd / "own.npy"))

    run_xmr("score", "--run", run, "--dataset", "synth_dev", "--out", cwd / "dev.npy", cwd=cwd, check=True)
    dev = np.load(cwd / "dev.npy")
    assert dev.shape == (12, 60) and not np.allclose(dev, np.load(cwd / "own.npy"))  # other test images
    assert gallery.stat().st_mtime_ns == before  # the run's cached gallery is its own test split's, untouched
    # the Python API reads the same split: its embeddings give `xmr score --dataset`'s matrix
    with monkeypatch.context() as mp:
        mp.chdir(cwd)  # where config/datasets/synth_dev.yaml is found, as for the commands
        m = xmr.load(run, device="cpu")
        g = m.encode_split(dataset="synth_dev")
    np.testing.assert_allclose(m.similarity(g["image_emb"], g["text_emb"]), dev, atol=1e-6)
    assert gallery.stat().st_mtime_ns == before

    out = run_xmr("test", "--run", run, "--sims", cwd / "dev.npy", "--dataset", "synth_dev", "--out",
                  cwd / "dev.json", cwd=cwd, check=True).stdout
    assert out.startswith("dvse_docs on synth_dev (trained on synth) [plain, rerank=none]"), out
    res = json.loads((cwd / "dev.json").read_text())
    assert (res["dataset"], res["trained_on"], res["recipe"]) == ("synth_dev", "synth", "dvse_docs")
    # DVSE's set statistics on synth_dev's test images, stored beside the run's own; the own ones stay its test split's
    assert res["set_statistics"]["split"] == "test" and (run / "set_stats_synth_dev_test.json").is_file()
    own = json.loads((run / "set_stats_test.json").read_text())
    assert own["key"] != json.loads((run / "set_stats_synth_dev_test.json").read_text())["key"]
    # the recalls of the matrix against synth_dev's own pairing (image i's captions 5i..5i+4), as `xmr evaluate`
    # computes them from the matrix alone
    run_xmr("evaluate", "--sims", cwd / "dev.npy", "--protocol", "plain", "--out", cwd / "plain.json", check=True)
    plain = json.loads((cwd / "plain.json").read_text())
    for d in ("i2t", "t2i"):
        assert [res[d][k] for k in ("r1", "r5", "r10")] == [plain[d][k] for k in ("r1", "r5", "r10")]
    # the benchmark's per-run file (--reranks, as docs/evaluation.md prints it): the same plain evaluation, FR beside it
    both = run_xmr("test", "--run", run, "--sims", cwd / "dev.npy", "--dataset", "synth_dev", "--reranks", "none",
                   "fr", "--out", cwd / "both.json", cwd=cwd, check=True).stdout
    assert both.startswith("dvse_docs on synth_dev (trained on synth): none RSUM"), both
    doc = json.loads((cwd / "both.json").read_text())
    assert (doc["dataset"], doc["trained_on"]) == ("synth_dev", "synth") and set(doc["by_rerank"]) == {"none", "fr"}
    assert doc["by_rerank"]["none"]["rsum"] == res["rsum"]
    # synth_dev's annotations list each caption's other positive images: the extended metrics are reported
    assert res["extended"]["positives"] == "synth_scenes" and "map_at_r" in res["extended"]["t2i"]

    line = run_xmr("score", "--run", run, "--dataset", "nosuch", "--out", cwd / "x.npy", cwd=cwd)
    assert line.returncode == 2 and not (cwd / "x.npy").exists()
    assert line.stderr.strip().startswith("xmr score: error: dataset 'nosuch': no config/datasets/nosuch.yaml; "
                                          "known datasets: synth, synth_copy, synth_dev"), line.stderr


def test_the_tables_find_the_run_under_the_dataset_it_was_trained_on():
    """A results file of `xmr test --dataset synth_dev` names the dataset it was evaluated on; its training time
    (the summary's `train (min)`) is read from the run, which lies under the dataset it was trained on."""
    from xmr.report.tables import run_dir_of

    assert run_dir_of({"recipe": "dvse_demo", "dataset": "synth_dev", "trained_on": "synth"}) == \
        Path("runs/synth/dvse_demo")
    assert run_dir_of({"recipe": "dvse.dvse.s2", "dataset": "synth_dev", "trained_on": "synth"}) == \
        Path("runs/synth/bench/dvse/dvse/s2")
    assert run_dir_of({"recipe": "dvse_demo", "dataset": "synth"}) == Path("runs/synth/dvse_demo")


def test_a_dataset_file_with_the_runs_dataset_name_but_other_settings_is_one_line(tiny_synth_run, tmp_path):
    """`--dataset other/synth.yaml` naming the run's own dataset `synth`, with other files: which one was meant
    cannot be told from the results (`dataset: synth`), so the command stops and says how to name it; a file with
    the run's own settings under that name is the run's own dataset."""
    doc = yaml.safe_load((tiny_synth_run / "config.yaml").read_text())["dataset_cfg"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "synth.yaml").write_text(yaml.safe_dump({**doc, "annotations": str(tmp_path / "a.json")}))
    r = run_xmr("score", "--run", tiny_synth_run, "--dataset", tmp_path / "other" / "synth.yaml", "--out",
                tmp_path / "x.npy")
    # the same settings under the same name are the run's own dataset: scored as without --dataset
    (tmp_path / "same").mkdir()
    (tmp_path / "same" / "synth.yaml").write_text(yaml.safe_dump(doc))
    run_xmr("score", "--run", tiny_synth_run, "--dataset", tmp_path / "same" / "synth.yaml", "--out",
            tmp_path / "same.npy", check=True)
    run_xmr("score", "--run", tiny_synth_run, "--out", tmp_path / "own.npy", check=True)
    np.testing.assert_array_equal(np.load(tmp_path / "same.npy"), np.load(tmp_path / "own.npy"))
    assert r.returncode == 2 and not (tmp_path / "x.npy").exists()
    assert r.stderr.strip() == (f"xmr score: error: {tmp_path / 'other' / 'synth.yaml'}: names the run's own dataset "
                                f"'synth' with other settings than the run was trained with; give it a name of its "
                                f"own (name: and the file's name)"), r.stderr
