"""What Snakemake prints when the user's input is wrong, run as the user types it in a copy of the project: a
misspelt key in a recipe stops the workflow with xmr's one line (not an InputFunctionException of some other rule);
a job that fails (a dataset's `images:` pointing at no folder) leaves its one-line error on the console, after the
preflight's MISSING line and fix, not only in its log file (docs/faults.md, "A failed job")."""

from __future__ import annotations

import re

import pytest
import yaml

from conftest import run_xmr

from .helpers import BIN, copy_repo, make_tiny, run, tool_env

pytestmark = pytest.mark.integration


def test_a_misspelt_recipe_key_stops_snakemake_in_one_line(tmp_path):
    root = copy_repo(tmp_path / "repo")
    recipe = root / "config" / "recipes" / "synth" / "vsepp.yaml"
    doc = yaml.safe_load(recipe.read_text())
    doc["trian"] = doc.pop("train")
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    message = "config/recipes/synth/vsepp.yaml: unknown key 'trian'; did you mean: train, tracking?"
    trained = run_xmr("train", "--run", "runs/synth/vsepp", cwd=root)  # the command's own line, for comparison
    assert trained.returncode == 2 and trained.stderr.strip() == f"xmr train: error: {message}", trained.stderr
    for options in (["-n"], ["--cores", "1"]):  # planned, and run
        r = run([str(BIN / "snakemake"), *options, "results/synth/vsepp.json"], root, tool_env(root), timeout=300,
                check=False)
        assert r.returncode == 1, r.stdout[-3000:]
        assert r.stdout.splitlines().count(f"xmr workflow: error: {message}") == 1, r.stdout[-3000:]
        assert "Traceback" not in r.stdout and "Exception" not in r.stdout, r.stdout[-3000:]
        assert not re.search(r"^(local)?rule \w+:", r.stdout, flags=re.M)  # no job planned or started
    assert not any((root / ".snakemake" / "locks").iterdir())  # nothing to unlock afterwards


def test_a_wrong_images_folder_prints_the_failed_jobs_error_line(tmp_path):
    root = copy_repo(tmp_path / "repo")
    make_tiny(root, ("vsepp",))
    # a dataset of one's own (no generate: section) whose images: names a folder that is not there
    ds = yaml.safe_load((root / "config" / "datasets" / "synth.yaml").read_text())
    ds.pop("generate")
    ds.update(name="mine", root="data/mine", annotations="data/mine/dataset_synth.json", images="data/mine/imagez",
              obtain="copy them from the lab share")
    (root / "config" / "datasets" / "mine.yaml").write_text(yaml.safe_dump(ds, sort_keys=False))
    recipe = yaml.safe_load((root / "config" / "recipes" / "synth" / "vsepp.yaml").read_text())
    (root / "config" / "recipes" / "mine").mkdir()
    (root / "config" / "recipes" / "mine" / "vsepp.yaml").write_text(yaml.safe_dump({**recipe, "dataset": "mine"}))
    run_xmr("synth", "--dataset", "synth", "--out", "data/mine", cwd=root, check=True)  # images in data/mine/images

    r = run([str(BIN / "snakemake"), "--cores", "1", "results/mine/vsepp.json"], root, tool_env(root), timeout=300,
            check=False)
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    # the preflight names the folder and the fix before planning ...
    assert re.search(r"^ +MISSING +images +data/mine/imagez$", out, flags=re.M), out[:3000]
    assert "fix: put the image files under data/mine/imagez/ (copy them from the lab share)" in out
    # ... and the job that failed on it ends the console with its error line, the one line of its log
    after = out.split("Error in rule extract:")[-1]
    (failed,) = re.findall(r"^rule extract \((logs/extract/\S+\.log)\): (.+)$", after, flags=re.M)
    log_lines = [ln for ln in (root / failed[0]).read_text().splitlines() if ln.strip()]
    assert failed[1] == log_lines[-1]
    assert failed[1].startswith("xmr extract: error: data/mine/imagez/"), failed[1]
    assert "--rerun-incomplete" in out.split(failed[1])[-1]  # then what to do after a kill
