"""The patch-token path through the workflow at toy size: in a copy of the repository, `xmr tiny-tower` writes a
random-initialised tiny CLIP (a ViT image tower) into the folder config/backbones.yaml's clip_tiny_random names, and
`snakemake` trains config/recipes/synth/clip_tiny.yaml end to end (the ViT inside the model, trained from scratch),
scores and evaluates it on a small synth set. Its number is no claim; it must beat chance."""

from __future__ import annotations

import json

import pytest
import yaml

from .helpers import BIN, copy_repo, make_tiny, run, tool_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_tiny_clip_vit_trained_from_scratch_through_snakemake_beats_chance(tmp_path):
    root = copy_repo(tmp_path / "repo")
    make_tiny(root)
    # a ViT from scratch needs more than the tiny set's 40 training images to beat chance
    ds_path = root / "config" / "datasets" / "synth.yaml"
    ds = yaml.safe_load(ds_path.read_text())
    ds["generate"].update(n_train=120, n_val=20, n_test=20)
    ds_path.write_text(yaml.safe_dump(ds, sort_keys=False))
    env = tool_env(root)
    run([str(BIN / "python"), "-m", "xmr", "tiny-tower", "--family", "clip", "--out",
         "resources/models/clip-tiny-random"], root, env, timeout=300)
    run([str(BIN / "snakemake"), "-c2", "results/synth/clip_tiny.json"], root, env, timeout=600)
    result = json.loads((root / "results/synth/clip_tiny.json").read_text())
    assert result["method"] == "clip" and result["n_images"] == 20
    # chance on 20 images x 5 captions: text->image R@k = k/20 (5 + 25 + 50); image->text R@k = 1 - C(95, k) /
    # C(100, k), one of the image's 5 captions among the first k of 100 (5 + 23.0 + 41.6): RSUM 149.7
    assert result["rsum"] > 149.7 + 60, result
