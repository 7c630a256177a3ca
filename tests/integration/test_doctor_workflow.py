"""The workflow runs `xmr doctor` when it plans a real dataset's target: `snakemake -n` on a fresh clone."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from conftest import run_xmr

from .helpers import BIN, copy_repo, run, tool_env

pytestmark = pytest.mark.integration


def test_dry_run_reports_missing_coco_pieces_and_plans_anyway(tmp_path):
    root = copy_repo(tmp_path / "repo")  # a fresh clone: no data, weights or word vectors
    env = tool_env(root)
    out = run([str(BIN / "snakemake"), "-n", "results/coco/dvse_fr.json"], root, env, timeout=300).stdout
    assert out.count("xmr doctor coco dvse_fr") == 1  # reported once, before planning
    for piece in ("data/coco/dataset_coco.json", "data/coco/images", "resources/weights/bua-caffe-frcn-r101-k36.pth",
                  "resources/detectron2/test-caffe-r101-fix36.yaml", "resources/word_vectors/glove.840B.300d.txt"):
        assert re.search(rf"MISSING .*{re.escape(piece)}", out), piece
    if importlib.util.find_spec("detectron2") is None:
        assert re.search(r"MISSING +backend detectron2", out)
    assert "cheaper path:" in out and "data/coco/precomp/" in out
    assert out.index("xmr doctor coco") < out.index("Job stats")
    jobs = {m[0]: m[1] for m in re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M)}
    assert jobs == {"link_dataset": "1", "extract": "3", "train": "1", "score": "1", "evaluate": "1",
                    "total": "7"}
    # val/test extraction asks for less than the 113k-image train split
    extract = re.findall(r"rule extract:\n((?:    .*\n)+)", out)
    by_split = {re.search(r"split=(\w+)", b)[1]: re.search(r"runtime=(\d+)", b)[1] for b in extract}
    assert by_split == {"train": "720", "val": "120", "test": "120"}
    # the embedded dataset: no report
    out = run([str(BIN / "snakemake"), "-n", "results/synth/dvse.json"], root, env, timeout=300).stdout
    assert "xmr doctor" not in out


def test_a_dataset_with_too_few_captions_stops_the_dry_run_at_the_preflight(tmp_path):
    """What `xmr doctor` catches, the preflight catches: a split the reader refuses (an image with fewer captions
    than captions_per_image) stops the plan with the reader's one line, before any job (not in extraction)."""
    root = copy_repo(tmp_path / "repo")
    images = [{"filename": f"{k}.jpg", "split": split, "sentences": [{"raw": "a dog"}, {"raw": "a cat"}]}
              for k, split in enumerate(("train", "train", "val", "test"))]
    (root / "data" / "few").mkdir(parents=True)
    (root / "data" / "few" / "dataset_few.json").write_text(json.dumps({"images": images}))
    (root / "config" / "datasets" / "few.yaml").write_text(
        "name: few\nformat: karpathy\nroot: data/few\nannotations: data/few/dataset_few.json\ncaptions_per_image: 3\n")
    (root / "config" / "recipes" / "few").mkdir()
    (root / "config" / "recipes" / "few" / "vsepp.yaml").write_text(
        "extends: ../../methods/vsepp.yaml\ndataset: few\nfeatures: {backbone: efficientnet_lite0_128}\n")
    doctor = run_xmr("doctor", "few", "vsepp", cwd=root)
    error = doctor.stderr.strip().removeprefix("xmr doctor: error: ")
    assert doctor.returncode == 2 and error.startswith("data/few/dataset_few.json: images[0] (0.jpg) "), doctor.stderr
    assert "has 2 captions, fewer than captions_per_image=3" in error
    r = run([str(BIN / "snakemake"), "-n", "results/few/vsepp.json"], root, tool_env(root), timeout=300, check=False)
    assert r.returncode == 1, r.stdout[-3000:]
    assert r.stdout.splitlines().count(f"xmr workflow: error: {error}") == 1, r.stdout[-3000:]
    assert "Job stats" not in r.stdout and "Traceback" not in r.stdout, r.stdout[-3000:]
