"""Imported checkpoints are pipeline targets: a recipe with a ``checkpoint:`` section is imported (rule
import_checkpoint), scored and evaluated, never trained; in a temp copy of the repository."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import yaml

from .helpers import BIN, REPO, copy_repo, make_tiny, run, tool_env

pytestmark = pytest.mark.integration
FIX = REPO / "tests" / "fixtures" / "checkpoints" / "vse_infty"


def _jobs(out: str) -> dict[str, str]:
    return {m[0]: m[1] for m in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M)}


def test_dry_run_of_the_official_vse_infinity_target_plans_no_training(tmp_path):
    root = copy_repo(tmp_path / "repo")  # a fresh clone: no data, no checkpoint
    env = tool_env(root)
    out = run([str(BIN / "snakemake"), "-n", "results/coco/vse_inf_official_bigru_fr.json"], root, env,
              timeout=300).stdout
    jobs = _jobs(out)
    assert "train" not in jobs and jobs["import_checkpoint"] == "1"
    assert jobs["score"] == "1" and jobs["evaluate"] == "1"
    assert jobs.get("extract", jobs.get("import_scan")) == "1"  # the test split's features only
    assert re.search(r"MISSING +checkpoint \(vse_infty\) +data/checkpoints/vse_infty/coco_butd_region_bigru/"
                     r"model_best.pth", out)
    assert "huggingface.co/cccjc/vse-infty" in out
    # a recipe without a checkpoint: section still trains
    out = run([str(BIN / "snakemake"), "-n", "results/coco/vse_inf.json"], root, env, timeout=300).stdout
    assert _jobs(out)["train"] == "1" and "import_checkpoint" not in _jobs(out)


def test_fixture_checkpoint_target_runs_end_to_end(tmp_path):
    """The same chain at fixture size on synth: the reference-made VSE∞ fixture (2048-d regions) as the recipe's
    checkpoint, SCAN-style test features imported by xmr import-features, then snakemake builds the FR result.
    The fixture's image layer takes 2048-d regions, so the features are filed under a 2048-d backbone key (the
    import checks the size)."""
    root = copy_repo(tmp_path / "repo")
    make_tiny(root, ("vsepp",))  # tiny synth (the summary lists vsepp; nothing here builds it)
    env = tool_env(root)
    run([str(BIN / "snakemake"), "-c1", "data/synth/dataset_synth.json"], root, env, timeout=300)
    ck = root / "data" / "checkpoints" / "fixture"
    ck.mkdir(parents=True)
    for name in ("model_best.pth", "coco_precomp_vocab.json"):
        shutil.copy2(FIX / name, ck / name)
    test = [im for im in json.loads((root / "data/synth/dataset_synth.json").read_text())["images"]
            if im["split"] == "test"]
    precomp = tmp_path / "precomp"
    precomp.mkdir()
    rng = np.random.default_rng(0)
    np.save(precomp / "test_ims.npy", rng.normal(0.5, 2.0, (len(test), 6, 2048)).astype(np.float32))
    (precomp / "test_caps.txt").write_text("".join(s["raw"] + "\n" for im in test for s in im["sentences"]))
    feats = "features_fixture/synth/resnet152_224/test.h5"
    run([str(BIN / "python"), "-m", "xmr", "import-features", "--format", "scan", "--src", str(precomp),
         "--src-split", "test", "--dataset", "synth", "--split", "test", "--out", feats, "--no-verify-captions",
         "--no-progress"], root, env, timeout=300)
    recipe = {"extends": "../../methods/vse_inf.yaml", "dataset": "synth",
              "features": {"backbone": "resnet152_224", "dir": "features_fixture"},
              "model": {"embed_dim": 32}, "tracking": {"enabled": False},
              "checkpoint": {"format": "vse_infty", "src": "data/checkpoints/fixture/model_best.pth",
                             "vocab": "data/checkpoints/fixture/coco_precomp_vocab.json"}}
    (root / "config/recipes/synth/vse_inf_fixture_ckpt.yaml").write_text(yaml.safe_dump(recipe))
    out = run([str(BIN / "snakemake"), "-c1", "results/synth/vse_inf_fixture_ckpt_fr.json"], root, env,
              timeout=600).stdout
    jobs = _jobs(out)
    assert "train" not in jobs and jobs["import_checkpoint"] == "1" and jobs["evaluate"] == "1"
    run_dir = root / "runs/synth/vse_inf_fixture_ckpt"
    assert {"best.pt", "config.yaml", "vocab.json", "provenance.json", "test_sims.npy"} <= {
        p.name for p in run_dir.iterdir()}
    assert not (run_dir / "train.json").exists()
    sims = np.load(run_dir / "test_sims.npy")
    assert sims.shape == (len(test), 5 * len(test)) and np.abs(sims).max() <= 1 + 1e-5
    result = json.loads((root / "results/synth/vse_inf_fixture_ckpt_fr.json").read_text())
    assert result["rerank"] == "fr" and result["recipe"] == "vse_inf_fixture_ckpt" and result["method"] == "vse_inf"
    assert result["n_images"] == len(test) and 0 <= result["rsum"] <= 600
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["recipe"].endswith("vse_inf_fixture_ckpt.yaml") and prov["format"] == "vse_infty"
    # and like any run: free-text search over the test gallery (the fixture's nltk tokens, its vocabulary)
    out = run([str(BIN / "python"), "-m", "xmr", "search", "--run", str(run_dir), "--text", "a red car", "--k", "3"],
              root, env, timeout=300).stdout
    assert "query: a red car  (test split, vse_inf)" in out
    assert [int(m) for m in re.findall(r"^\s+(\d)\s+-?\d\.\d{4}\s", out, flags=re.M)] == [1, 2, 3], out
