"""The model zoo (xmr/studies/zoo.py, `xmr model-zoo`, docs/model_zoo.md) and `xmr doctor --zoo`: every released model
has a recipe with a checkpoint: section; the committed page is exactly what the generator writes from the
committed recipes; xmr's numbers appear beside the paper's when a results file exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_xmr
from xmr.studies.zoo import zoo_entries

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config"

# the released image-text models of the reference repositories (all 10 VSE∞ models; VSE++'s precomputed-VGG19
# and full-image runs; PVSE K = 2 and K = 1; both PCME files); format of each
RELEASED = {
    ("coco", "vse_inf_official_bigru"): "vse_infty", ("f30k", "vse_inf_official_bigru"): "vse_infty",
    ("coco", "vse_inf_official_bert"): "vse_infty", ("f30k", "vse_inf_official_bert"): "vse_infty",
    ("coco", "vse_inf_official_butd_grid_bigru"): "vse_infty",
    ("f30k", "vse_inf_official_butd_grid_bigru"): "vse_infty",
    ("coco", "vse_inf_official_butd_grid_bert"): "vse_infty", ("f30k", "vse_inf_official_butd_grid_bert"): "vse_infty",
    ("coco", "vse_inf_official_wsl_grid_bert"): "vse_infty", ("f30k", "vse_inf_official_wsl_grid_bert"): "vse_infty",
    ("coco", "vsepp_official_precomp"): "vsepp", ("f30k", "vsepp_official_precomp"): "vsepp",
    ("coco", "vsepp_official_resnet152"): "vsepp", ("f30k", "vsepp_official_resnet152"): "vsepp",
    ("coco", "vsepp_official_vgg19"): "vsepp", ("f30k", "vsepp_official_vgg19"): "vsepp",
    ("coco", "pvse_official"): "pvse", ("coco", "pvse_official_k1"): "pvse",
    ("coco", "pcme_official"): "pcme", ("coco", "pcme_official_cutmix"): "pcme",
}


def test_every_released_model_has_a_zoo_recipe():
    entries = {(e.dataset, e.name): e for e in zoo_entries(CONFIG)}
    assert {k: entries[k].format for k in RELEASED if k in entries} == RELEASED
    for e in entries.values():
        assert e.src.startswith("data/checkpoints/") and e.published, e.name


def test_committed_page_is_what_the_generator_writes(tmp_path):
    """docs/model_zoo.md cannot go stale: regenerated from the committed recipes (no results files) it is equal."""
    out = tmp_path / "model_zoo.md"
    run_xmr("model-zoo", "--out", out, "--results-root", tmp_path / "no_results", cwd=REPO, check=True)
    assert out.read_text() == (REPO / "docs" / "model_zoo.md").read_text(), \
        "docs/model_zoo.md is stale: run `snakemake -c1 docs/model_zoo.md` (or `xmr model-zoo`) and commit it"


def _row(page: str, name: str) -> str:
    rows = [line for line in page.splitlines() if line.startswith(f"| **{name}**")]
    assert len(rows) == 1, name
    return rows[0]


def test_hand_checked_row_and_xmr_numbers_beside_the_papers(tmp_path):
    """The CutMix row written out by hand from its recipe; then hand-made results files fill the xmr columns."""
    out = tmp_path / "model_zoo.md"
    results = tmp_path / "results"
    run_xmr("model-zoo", "--out", out, "--results-root", results, cwd=REPO, check=True)
    assert _row(out.read_text(), "coco/pcme_official_cutmix") == (
        "| **coco/pcme_official_cutmix**<br>PCME (Chun et al., CVPR 2021), MS-COCO, ResNet-152 + GloVe BiGRU, "
        "CutMix-pretrained ResNet-152: the released checkpoint<br>`--format pcme` "
        "| https://github.com/naver-ai/pcme/releases/download/v1.0.0/pcme_cutmix_coco.pth (README 'Evaluate "
        "pretrained models', COCO Caption table) "
        "| not given by the authors "
        "| `results/coco/pcme_official_cutmix.json`<br>`results/coco/pcme_official_cutmix_fr.json` "
        "| COCO 1K: 68.3 / – / – · 56.7 / – / – [3] "
        "| no results file yet | no results file yet |")
    # PVSE's README prints two decimals: kept (YAML reads 86.50 as 86.5)
    assert "COCO 1K: 69.24 / 91.62 / 96.64 · 55.21 / 86.50 / 93.73 [4]" in _row(out.read_text(), "coco/pvse_official")

    def metrics(i2t, t2i):
        return {"i2t": dict(zip(("r1", "r5", "r10"), i2t)), "t2i": dict(zip(("r1", "r5", "r10"), t2i)),
                "rsum": sum(i2t) + sum(t2i)}

    (results / "coco").mkdir(parents=True)
    plain = {"protocols": {"coco1k": metrics([66.04, 90.31, 95.96], [52.51, 84.12, 91.9]),
                           "coco5k": metrics([41.0, 70.0, 80.0], [30.0, 60.0, 70.0])}}
    fr = {"by_rerank": {"none": {"protocols": {"coco1k": metrics([70.0, 92.0, 97.0], [55.0, 86.0, 93.0])}}}}
    (results / "coco" / "pvse_official_k1.json").write_text(json.dumps(plain))
    (results / "coco" / "pvse_official_k1_fr.json").write_text(json.dumps(fr))
    run_xmr("model-zoo", "--out", out, "--results-root", results, cwd=REPO, check=True)
    cells = _row(out.read_text(), "coco/pvse_official_k1").split(" | ")
    # 66.04 -> 66.0, 95.96 -> 96.0, 52.51 -> 52.5; RSUM 66.04 + 90.31 + 95.96 + 52.51 + 84.12 + 91.9 = 480.84
    assert cells[-2] == ("COCO 1K: 66.0 / 90.3 / 96.0 · 52.5 / 84.1 / 91.9 · RSUM 480.8<br>"
                         "COCO 5K: 41.0 / 70.0 / 80.0 · 30.0 / 60.0 / 70.0 · RSUM 351.0")
    assert cells[-1] == "COCO 1K: 70.0 / 92.0 / 97.0 · 55.0 / 86.0 / 93.0 · RSUM 493.0 |"
    assert _row(out.read_text(), "coco/pvse_official").endswith("| no results file yet | no results file yet |")


def test_pcme_cutmix_is_evaluated_as_pcme(monkeypatch):
    """naver-ai/pcme evaluates pcme_cutmix_coco.pth with the same config and script as pcme_coco.pth (CutMix only
    changed the backbone's ImageNet pre-training): the two recipes differ in the file and its zoo entry only."""
    from xmr.run.config import load_run_config

    monkeypatch.chdir(REPO)
    plain = load_run_config("config/recipes/coco/pcme_official.yaml")
    cutmix = load_run_config("config/recipes/coco/pcme_official_cutmix.yaml")
    zoo_keys = ("src", "published", "paper_rows")
    assert {k: v for k, v in cutmix["checkpoint"].items() if k not in zoo_keys} == \
           {k: v for k, v in plain["checkpoint"].items() if k not in zoo_keys}
    assert cutmix["checkpoint"]["src"].endswith("pcme_cutmix_coco.pth")
    differ = sorted(k for k in set(plain) | set(cutmix) if plain.get(k) != cutmix.get(k))
    assert differ == ["checkpoint", "name", "paper"]


def test_a_paper_row_with_two_recalls_is_refused(tmp_path):
    import yaml

    from xmr.core.errors import XmrError
    from xmr.run.config import load_run_config

    doc = yaml.safe_load((CONFIG / "recipes/coco/pcme_official.yaml").read_text())
    doc["extends"] = str(CONFIG / "methods/pcme.yaml")
    doc["checkpoint"]["paper_rows"][0]["i2t"] = [68.8, 91.6]
    path = tmp_path / "pcme_official.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(XmrError, match="paper_rows"):
        load_run_config(path)


def test_doctor_zoo_names_what_each_target_still_needs(tmp_path):
    """On a bare checkout every zoo target is listed with its missing pieces; putting a model's file, vocabulary,
    annotations and images in place makes exactly that target ready. Models that run their own CNN ask for no
    ImageNet weights."""
    r = run_xmr("doctor", "--zoo", "--config-dir", CONFIG, cwd=tmp_path)
    assert r.returncode == 1 and "\nmodel zoo:\n" in r.stdout, r.stdout[-2000:] + r.stderr
    summary = r.stdout.split("\nmodel zoo:\n")[1].splitlines()
    lines = {line.split()[0]: line for line in summary[:-1]}
    assert set(lines) == {f"results/{ds}/{name}.json" for ds, name in RELEASED} | {
        e.target() for e in zoo_entries(CONFIG)}
    assert lines["results/coco/pvse_official.json"].split("  ", 2)[-1].strip() == (
        "needs annotation file, checkpoint (pvse), checkpoint vocabulary, images")
    assert "needs annotation file, checkpoint (pcme), images" in lines["results/coco/pcme_official.json"]
    assert "resnet152-f82ba261.pth" not in r.stdout  # the CNN comes from the checkpoint
    # VSE++'s VGG19 vectors cannot be extracted: the authors' file is asked for (COCO test = SCAN's testall), with
    # the import command rule import_precomputed runs, and no images nor extractor
    assert lines["results/coco/vsepp_official_precomp.json"].split("  ", 2)[-1].strip() == (
        "needs annotation file, checkpoint (vsepp), checkpoint vocabulary, precomputed features test")
    assert "precomputed features test  data/coco/vsepp_precomp/testall_ims.npy" in r.stdout
    assert ("rule import_precomputed then runs `xmr import-features --format scan --pooled --src "
            "data/coco/vsepp_precomp --dataset coco --split test --out features/coco/vsepp_vgg19_precomp/test.h5`"
            ) in r.stdout
    assert "releases/download/v1.0.0/pcme_cutmix_coco.pth" in r.stdout  # the recipe's own download
    for rel in ("data/checkpoints/pvse/coco_pvse.pth", "data/checkpoints/pvse/vocab/coco_vocab.pkl",
                "data/coco/dataset_coco.json", "data/coco/images/1.jpg"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    images = [{"filename": f"{split}.jpg", "split": split, "sentences": [{"raw": f"a {split} photo"}] * 5}
              for split in ("train", "val", "test")]  # doctor reads the splits: one image each, five captions
    (tmp_path / "data/coco/dataset_coco.json").write_text(json.dumps({"images": images}))
    r = run_xmr("doctor", "--zoo", "--config-dir", CONFIG, cwd=tmp_path)
    assert r.returncode == 1 and "\nmodel zoo:\n" in r.stdout, r.stdout[-2000:] + r.stderr
    lines = {line.split()[0]: line for line in r.stdout.split("\nmodel zoo:\n")[1].splitlines()[:-1]}
    assert lines["results/coco/pvse_official.json"].endswith("  ready")
    assert "needs checkpoint (pvse)" in lines["results/coco/pvse_official_k1.json"]  # its own file is still missing
    assert r.stdout.splitlines()[-1] == f"1 of {len(zoo_entries(CONFIG))} zoo targets ready (each also as _fr.json)"
    bad = run_xmr("doctor", "coco", "--zoo", "--config-dir", CONFIG, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "xmr doctor: error: doctor --zoo checks every zoo target; give no DATASET/TARGET with it")


def test_a_recipe_without_zoo_keys_is_listed_and_says_so(tmp_path):
    """A checkpoint recipe that names only format/src/vocab (as the first official recipes did) still gets its row;
    the page says what the recipe does not state instead of claiming the authors give no SHA-256."""
    from xmr.studies.zoo import ZooEntry, render_zoo

    entry = ZooEntry(dataset="coco", name="vse_inf_official_x", recipe="config/recipes/coco/vse_inf_official_x.yaml",
                     format="vse_infty", src="data/checkpoints/x.pth", vocab=None, paper="a model")
    row = _row(render_zoo([entry], tmp_path, CONFIG), "coco/vse_inf_official_x")
    assert row == ("| **coco/vse_inf_official_x**<br>a model<br>`--format vse_infty` "
                   "| not in the recipe (config/recipes/coco/vse_inf_official_x.yaml) | not in the recipe "
                   "| `results/coco/vse_inf_official_x.json`<br>`results/coco/vse_inf_official_x_fr.json` "
                   "| not in the recipe | no results file yet | no results file yet |")
