"""The recipes on transformers towers and VSE+2AD's grid and patch models plan on a fresh copy of the repository (no
data, no model folders): one `snakemake -n` over their COCO and Flickr30K targets, the end-to-end ones reading image
files (no extraction), the heads on CLIP tokens extracting them; `xmr doctor` names the missing model folders."""

from __future__ import annotations

import re

import pytest

from .helpers import BIN, copy_repo, run, tool_env

pytestmark = pytest.mark.integration

TARGETS = [f"results/{ds}/{name}.json" for ds in ("coco", "f30k") for name in ("vse_2ad_grid", "vse_2ad_patch")] + [
    "results/coco/vse_inf_clip.json", "results/coco/dvse_clip_fr.json"]


def test_patch_and_grid_recipes_plan_and_doctor_names_the_model_folders(tmp_path):
    root = copy_repo(tmp_path / "repo")
    env = tool_env(root)
    out = run([str(BIN / "snakemake"), "-n", *TARGETS], root, env, timeout=600).stdout
    jobs = {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M)}
    # six trainings; the two heads on CLIP tokens share one extraction per split, the end-to-end four need none
    assert jobs["train"] == 6 and jobs["extract"] == 3 and jobs["evaluate"] == 6, jobs
    r = run([str(BIN / "python"), "-m", "xmr", "doctor", "coco", "results/coco/vse_2ad_patch.json"], root, env,
            check=False)
    assert re.search(r"MISSING\s+backbone vit_b16_224 weights\s+resources/models/vit-base-patch16-224",
                     r.stdout), r.stdout
    r = run([str(BIN / "python"), "-m", "xmr", "doctor", "coco", "results/coco/vse_inf_clip.json"], root, env,
            check=False)
    assert re.search(r"MISSING\s+backbone clip_vit_b16 weights\s+data/checkpoints/clip-vit-base-patch16", r.stdout), \
        r.stdout
