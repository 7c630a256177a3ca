"""Your own dataset (docs/datasets.md, "Your own dataset"), with real Snakemake processes in copies of the repository:
the section's files and commands run as printed on 36 generated images; a broken dataset config stops its own
targets only, and files outside a dataset's root are read where they are; a dataset without a `resources` entry asks
for the local CPUs, also under `--profile slurm`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from PIL import Image, ImageDraw

from .helpers import BIN, REPO, copy_repo, run, tool_env

pytestmark = pytest.mark.integration

SECTION = "## Your own dataset"
COLOURS = {"red": (220, 30, 30), "green": (30, 180, 60), "blue": (40, 60, 220), "yellow": (230, 210, 40)}
SHAPES = ("square", "disc", "bar")
SIZES = ("small", "large", "huge")


def section_blocks() -> list[tuple[str, str, str]]:
    """``(language, code, marker line)`` of every fenced block of the section, in order."""
    text = (REPO / "docs" / "datasets.md").read_text()
    body = text[text.index(SECTION):]
    body = body[:body.index("\n## ", len(SECTION))]
    out, before = [], ""
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", body, flags=re.S | re.M):
        before = body[:m.start()].rstrip().splitlines()[-1]
        out.append((m.group(1), m.group(2), before))
    return out


def config_files() -> dict[str, str]:
    """The section's YAML blocks by the path on their first line (``# config/datasets/mydata.yaml``)."""
    return {code.splitlines()[0][2:]: code for lang, code, _ in section_blocks()
            if lang == "yaml" and code.startswith("# config/")}


def documented_commands() -> str:
    [code] = [code for lang, code, marker in section_blocks()
              if lang == "bash" and "covered-by tests/integration/test_own_dataset.py" in marker]
    return code


def draw(path: Path, colour: str, shape: str, size: str) -> None:
    """A 32-pixel PNG: one shape of one colour and size on grey."""
    im = Image.new("RGB", (32, 32), (128, 128, 128))
    r = {"small": 5, "large": 10, "huge": 15}[size]
    box = (16 - r, 16 - r, 16 + r, 16 + r) if shape != "bar" else (16 - r, 13, 16 + r, 19)
    (ImageDraw.Draw(im).ellipse if shape == "disc" else ImageDraw.Draw(im).rectangle)(box, fill=COLOURS[colour])
    im.save(path)


def make_dataset(root: Path, name: str = "mydata") -> Path:
    """36 images (24 train, 6 val, 6 test) with 2 captions each, in a Karpathy JSON holding only the three fields
    the section requires; returns the JSON's path."""
    images = root / "images"
    images.mkdir(parents=True)
    records = []
    combos = [(c, s, z) for c in COLOURS for s in SHAPES for z in SIZES]  # 36
    for k, (colour, shape, size) in enumerate(combos):
        filename = f"{k + 1:04d}.png"
        draw(images / filename, colour, shape, size)
        split = "train" if k % 6 < 4 else "val" if k % 6 == 4 else "test"
        records.append({"filename": filename, "split": split,
                        "sentences": [{"raw": f"a {size} {colour} {shape}"},
                                      {"raw": f"one {colour} {shape} on grey, {size}"}]})
    path = root / f"dataset_{name}.json"
    path.write_text(json.dumps({"images": records}))
    return path


def test_the_documented_example_trains_and_evaluates_beside_a_broken_dataset_config(tmp_path):
    blocks = section_blocks()
    # the JSON shown is the whole format the example needs: filename, split, sentences[].raw
    # the first JSON block is the whole format; the second, optional extended positives, is one image of it
    sample, extended = [json.loads(code) for lang, code, _ in blocks if lang == "json"]
    assert extended["sentences"][0]["positives"] and set(extended) <= {"filename", "split", "sentences"}
    assert {frozenset(img) for img in sample["images"]} == {frozenset({"filename", "split", "sentences"})}
    assert {frozenset(s) for img in sample["images"] for s in img["sentences"]} == {frozenset({"raw"})}
    root = copy_repo(tmp_path / "repo")
    files = config_files()
    assert set(files) >= {"config/datasets/mydata.yaml", "config/recipes/mydata/vsepp.yaml"}
    for rel in ("config/datasets/mydata.yaml", "config/recipes/mydata/vsepp.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(files[rel])
    ds = yaml.safe_load(files["config/datasets/mydata.yaml"])
    assert make_dataset(root / "data" / "mydata") == root / ds["annotations"]
    # another dataset's config is broken: the example's target plans and runs all the same
    (root / "config" / "datasets" / "broken.yaml").write_text(
        "name: broken\nformat: karpathy\nroot: data/broken\nsource: /nowhere\nannotations: /elsewhere/b.json\n"
        "captions_per_image: 5\n")
    out = run(["bash", "-e", "-c", documented_commands()], root, tool_env(root), timeout=600).stdout
    # xmr doctor mydata: 24 / 6 / 6 images, 2 captions each
    for split, n in (("train", 24), ("val", 6), ("test", 6)):
        assert re.search(rf"ok +split {split} +data/mydata/dataset_mydata\.json +\({n} images, {2 * n} captions\)",
                         out), out[-3000:]
    assert "nothing missing" in out
    result = json.loads((root / "results" / "mydata" / "vsepp.json").read_text())
    assert result["dataset"] == "mydata"
    assert json.loads((root / "runs" / "mydata" / "vsepp" / "train.json").read_text())["epochs_trained"] == 1
    assert re.search(r"^\| mydata \| vsepp \| plain \|", out, flags=re.M), out[-2000:]


SOURCE_OUTSIDE_ROOT = ("config/datasets/broken.yaml: annotations: /elsewhere/b.json is outside root data/broken, where "
                       "`source:` links the shared copy; drop `source:` to read the files where they are, or set "
                       "annotations: under data/broken/")


@pytest.mark.parametrize("broken, error", [
    ("name: broken\nformat: karpathy\nroot: data/broken\nsource: /nowhere\nannotations: /elsewhere/b.json\n"
     "captions_per_image: 5\n", SOURCE_OUTSIDE_ROOT),
    ("name: broken\nformat: karpathy\nanotations: data/broken/b.json\ncaptions_per_image: 5\n",
     "config/datasets/broken.yaml: unknown key 'anotations'; did you mean: annotations, obtain?"),
])
def test_a_broken_dataset_config_stops_its_own_targets_only(tmp_path, broken, error):
    root = copy_repo(tmp_path / "repo")
    env = tool_env(root)
    (root / "config" / "datasets" / "broken.yaml").write_text(broken)
    (root / "config" / "recipes" / "broken").mkdir()
    (root / "config" / "recipes" / "broken" / "vsepp.yaml").write_text(
        "extends: ../../methods/vsepp.yaml\ndataset: broken\nfeatures: {backbone: efficientnet_lite0_128}\n")
    snakemake = str(BIN / "snakemake")
    demo = run([snakemake, "-n", "results/synth/dvse.json", "results/synth/dvse_fr.json"], root, env, timeout=300)
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", demo.stdout.split("Job stats:")[1], flags=re.M))
    assert jobs == {"synth": "1", "extract": "3", "train": "1", "score": "1", "evaluate": "2", "total": "8"}
    own = run([snakemake, "-n", "results/broken/vsepp.json"], root, env, timeout=300, check=False)
    assert own.returncode == 1
    assert own.stdout.strip().splitlines()[-1] == f"snakemake: {error}"
    assert "Traceback" not in own.stdout and "Exception" not in own.stdout
    doctor = run([str(BIN / "xmr"), "doctor", "broken"], root, env, check=False)
    assert (doctor.returncode, doctor.stdout.strip()) == (2, f"xmr doctor: error: {error}")


def test_files_outside_the_root_are_read_where_they_are(tmp_path):
    root = copy_repo(tmp_path / "repo")
    env = tool_env(root)
    elsewhere = tmp_path / "elsewhere"  # outside the repository, and outside the config's root
    make_dataset(elsewhere, "outside")
    (root / "config" / "datasets" / "outside.yaml").write_text(yaml.safe_dump({
        "name": "outside", "format": "karpathy", "root": "data/outside",
        "annotations": str(elsewhere / "dataset_outside.json"), "images": str(elsewhere / "images"),
        "captions_per_image": 2}))
    (root / "config" / "recipes" / "outside").mkdir()
    (root / "config" / "recipes" / "outside" / "vsepp.yaml").write_text(
        "extends: ../../methods/vsepp.yaml\ndataset: outside\nfeatures: {backbone: efficientnet_lite0_128}\n")
    out = run([str(BIN / "snakemake"), "-n", "results/outside/vsepp.json"], root, env, timeout=300).stdout
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], flags=re.M))
    assert jobs == {"extract": "3", "train": "1", "score": "1", "evaluate": "1", "total": "6"}  # no link_dataset
    assert f"input: {elsewhere / 'dataset_outside.json'}" in out
    doctor = run([str(BIN / "xmr"), "doctor", "outside"], root, env).stdout
    assert re.search(rf"ok +split test +{re.escape(str(elsewhere))}/dataset_outside\.json +\(6 images, 12 captions\)",
                     doctor), doctor


def _train_request(out: str) -> dict[str, str]:
    block = re.search(r"rule train:\n(.*?)(?=\n\n|\Z)", out, flags=re.S)[1]
    return dict(re.findall(r"(\w+)=([^,\s]+)", re.search(r"resources: (.*)", block)[1]))


def _extract_requests(out: str) -> dict[str, dict[str, str]]:
    blocks = re.findall(r"rule extract:\n((?:    .*\n)+)", out)
    return {re.search(r"split=(\w+)", b)[1]: dict(re.findall(r"(\w+)=([^,\s]+)", re.search(r"resources: (.*)", b)[1]))
            for b in blocks}


def test_a_dataset_without_a_resources_entry_asks_for_the_local_cpus_under_slurm(tmp_path):
    root = copy_repo(tmp_path / "repo")
    files = config_files()
    for rel in ("config/datasets/mydata.yaml", "config/recipes/mydata/vsepp.yaml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(files[rel])
    make_dataset(root / "data" / "mydata")
    stubs = tmp_path / "no-slurm"  # SLURM's commands: stubs that fail and log their calls
    stubs.mkdir()
    for name in ("sbatch", "srun", "squeue", "sinfo", "sacct", "scontrol", "scancel", "sacctmgr", "sshare"):
        (stubs / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {stubs}/calls.log\nexit 127\n')
        (stubs / name).chmod(0o755)
    env = tool_env(root)
    env["PATH"] = f"{stubs}:{env['PATH']}"
    cmd = [str(BIN / "snakemake"), "-n", "--profile", "slurm", "results/mydata/vsepp.json"]
    out = run(cmd, root, env, timeout=300).stdout
    # config/config.yaml resources.default (the local CPUs), by hand: train 0 GPUs, 16000 MB, 240 min, 2 CPUs;
    # extraction 0 GPUs, 8000 MB, 120 min, 2 CPUs for every split
    train = _train_request(out)
    assert (train["gpu"], train["mem_mb"], train["runtime"], train["cpus_per_task"]) == ("0", "16000", "240", "2")
    assert {s: (r["gpu"], r["mem_mb"], r["runtime"]) for s, r in _extract_requests(out).items()} == {
        s: ("0", "8000", "120") for s in ("train", "val", "test")}
    # one line gives it the GPU cluster's requests: train 1 GPU, 64000 MB, 2880 min, 8 CPUs; extraction of the
    # train split 32000 MB / 720 min, of val and test 16000 MB / 120 min
    (tmp_path / "cluster.yaml").write_text("resources:\n  mydata: {like: gpu_cluster}\n")
    out = run(cmd + ["--configfile", str(tmp_path / "cluster.yaml")], root, env, timeout=300).stdout
    train = _train_request(out)
    assert (train["gpu"], train["mem_mb"], train["runtime"], train["cpus_per_task"]) == ("1", "64000", "2880", "8")
    assert {s: (r["gpu"], r["mem_mb"], r["runtime"]) for s, r in _extract_requests(out).items()} == {
        "train": ("1", "32000", "720"), "val": ("1", "16000", "120"), "test": ("1", "16000", "120")}
    calls = (stubs / "calls.log").read_text() if (stubs / "calls.log").exists() else ""
    assert "sbatch" not in calls  # planned, nothing submitted
