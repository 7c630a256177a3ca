"""Every model-zoo target (a recipe with a checkpoint: section, docs/model_zoo.md) and its Fast Re-ranking
variant plans no training: one `snakemake -n` over all of them, in a fresh copy of the repository (no data, no
checkpoint files)."""

from __future__ import annotations

import re

import pytest

from xmr.studies.zoo import zoo_entries

from .helpers import BIN, REPO, copy_repo, run, tool_env

pytestmark = pytest.mark.integration


def _jobs(out: str) -> dict[str, int]:
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M)}


def test_every_zoo_target_and_its_fr_variant_plan_no_training(tmp_path):
    entries = zoo_entries(REPO / "config")
    root = copy_repo(tmp_path / "repo")
    targets = [t for e in entries for t in (e.target(), e.target("fr"))]
    out = run([str(BIN / "snakemake"), "-n", "-p", *targets], root, tool_env(root), timeout=600).stdout
    jobs = _jobs(out)
    assert "train" not in jobs and "train_seeded" not in jobs, jobs
    assert jobs["import_checkpoint"] == len(entries)  # one import per model, shared by its two targets
    assert jobs["score"] == len(entries)  # one test similarity matrix per model: plain and FR read the same one
    assert jobs["evaluate"] == 2 * len(entries)
    # features: only the test split of the precomputed ones (one job per dataset and backbone); models that run
    # their own CNN read the image files and need none. The authors' own vectors (VSE++'s VGG19 *_precomp) have
    # no extractor: rule import_precomputed runs their import_command, never extract
    backbones, authors = set(), set()
    for e in entries:
        text = (REPO / e.recipe).read_text()
        if "source: images" not in text:
            key = re.search(r"backbone: (\w+)", text).group(1)
            (authors if key.endswith("_precomp") else backbones).add((e.dataset, key))
    assert jobs.get("extract", 0) + jobs.get("import_scan", 0) == len(backbones) >= 2  # coco and f30k BUTD
    assert jobs["import_precomputed"] == len(authors) == 2  # coco and f30k vsepp_vgg19_precomp
    for ds, key in authors:
        assert re.search(rf"rule import_precomputed:\n(.*\n)*?    output: features/{ds}/{key}/test\.h5", out)
        assert f"-m xmr import-features --format scan --pooled --src data/{ds}/vsepp_precomp --dataset {ds} --split " \
               f"test --out features/{ds}/{key}/test.h5" in out
    for e in entries:  # every official file is named, missing, with where it is published
        assert re.search(rf"MISSING +checkpoint \({e.format}\) +{re.escape(e.src)}", out), e.name


def test_import_precomputed_runs_the_backbones_import_command(tmp_path):
    """A precomputed-only backbone's features are made by its import_command (config/backbones.yaml
    vsepp_vgg19_precomp), through Snakemake: four pooled vectors in a VSE++ data.tar layout under
    data/{dataset}/vsepp_precomp/ come out as the feature file, row for row, with no extract job."""
    import h5py
    import numpy as np
    import yaml

    from xmr.features.store import FeatureFile

    root = copy_repo(tmp_path / "repo")
    ids = ["391895", "9", "522418", "25"]
    src = root / "data" / "vp" / "vsepp_precomp"
    src.mkdir(parents=True)
    pooled = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    np.save(src / "testall_ims.npy", pooled)
    (src / "testall_caps.txt").write_text("".join(f"Image {i} caption {k}.\n" for i in ids for k in range(5)))
    (src / "testall_ids.txt").write_text("\n".join(ids) + "\n")
    (root / "config" / "datasets" / "vp.yaml").write_text(yaml.safe_dump({
        "name": "vp", "format": "precomp", "root": "data/vp/vsepp_precomp", "captions_per_image": 5,
        "splits": {"train": ["testall"], "val": ["testall"], "test": ["testall"]}, "extra": {"pooled": True}}))
    out = run([str(BIN / "snakemake"), "-c1", "-p", "features/vp/vsepp_vgg19_precomp/test.h5"], root,
              tool_env(root)).stdout
    assert "import_precomputed" in _jobs(out) and "extract" not in _jobs(out), out
    h5 = root / "features" / "vp" / "vsepp_vgg19_precomp" / "test.h5"
    with h5py.File(h5, "r") as f:
        feats = f["features"][:]
    assert FeatureFile(h5).image_ids == ids  # a precomp dataset's order is its source file's
    np.testing.assert_array_equal(feats[:, 0], pooled)
