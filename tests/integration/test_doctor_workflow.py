"""The workflow runs `xmr doctor` when it plans a real dataset's target: `snakemake -n` on a fresh clone."""

from __future__ import annotations

import importlib.util
import re

import pytest

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
