"""One rule chain for every run kind: on a dataset whose `resources` give training 2 GPUs, an experiment variant and
a benchmark variant plan the same DDP launch and scheduler request as their recipe, and every one of them reads its
features from the folder its `features.dir` names (`snakemake -n -p` on a copy of the repository)."""

from __future__ import annotations

import re

import pytest
import yaml

from .helpers import BIN, copy_repo, run, tool_env

pytestmark = pytest.mark.integration

TARGETS = ["results/synth/dvse.json", "results/synth/exp/dvse_k_sweep/k_1.json",
           "results/synth/bench/benchmark/dvse/s0.json"]
RUNS = ["runs/synth/dvse", "runs/synth/exp/dvse_k_sweep/k_1", "runs/synth/bench/benchmark/dvse/s0"]


def jobs(out: str, rule: str) -> list[str]:
    """The text of each planned job of `rule` (its block up to the next blank line)."""
    return re.findall(rf"^rule {rule}:\n(.*?)(?:\n\n|\Z)", out, flags=re.M | re.S)


def test_variants_plan_the_recipes_ddp_launch_and_feature_dir(tmp_path):
    root = copy_repo(tmp_path / "repo")
    recipe = root / "config" / "recipes" / "synth" / "dvse.yaml"
    doc = yaml.safe_load(recipe.read_text())
    doc["features"] = {**doc.get("features", {}), "dir": "feats2"}
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "gpu2.yaml").write_text("resources:\n  synth:\n    train: {gpu: 2}\n")
    out = run([str(BIN / "snakemake"), "-n", "-p", *TARGETS, "--configfile", str(tmp_path / "gpu2.yaml")],
              root, tool_env(root), timeout=300).stdout

    train = jobs(out, "train")
    assert len(train) == 3
    for run_dir in RUNS:
        block = next(b for b in train if f"output: {run_dir}/best.pt" in b)
        # --threads: the cores Snakemake gives the job, torch's CPU threads in the training: synth asks for 2
        # (cpus_per_task), and a dry run plans on one core, so 1
        assert f"xmr train --run {run_dir} --nproc-per-node 2 --nnodes 1 --threads 1 --no-progress" in block, block
        assert re.search(r"resources: .*gpu=2, nodes=1, tasks=2, tasks_per_gpu=1, mpi=srun", block), block
        assert "input: feats2/synth/efficientnet_lite0_128/train.h5, feats2/synth/efficientnet_lite0_128/val.h5" \
            in block
    for block in jobs(out, "score"):
        assert "feats2/synth/efficientnet_lite0_128/test.h5" in block
    # the features are extracted into that folder, once per split for all three runs
    extract = jobs(out, "extract")
    assert sorted(re.search(r"output: (\S+)", b)[1] for b in extract) == [
        f"feats2/synth/efficientnet_lite0_128/{s}.h5" for s in ("test", "train", "val")]
    # synth's extractions take one core each, and the train split (the longest) has the priority: on 2 cores it
    # runs beside val, then test (config resources: `make demo` waits 18 s for its features, not 23)
    by_split = {re.search(r"split=(\w+)", b)[1]: b for b in extract}
    assert "priority: 1" in by_split["train"]
    assert all("priority" not in by_split[s] for s in ("val", "test"))
    # one CPU each: decoding in the main process (a worker process would compete with it for that core)
    assert all("--workers 0 --threads 1" in b for b in extract), extract
    assert not re.search(r"^rule (train|score|evaluate)_variant|^rule bench_", out, flags=re.M)
