"""Every model-zoo target (a recipe with a checkpoint: section, docs/model_zoo.md) and its Fast Re-ranking
variant plans no training: one `snakemake -n` over all of them, in a fresh copy of the repository (no data, no
checkpoint files)."""

from __future__ import annotations

import re

import pytest

from xmr.zoo import zoo_entries

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
