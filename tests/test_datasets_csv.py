"""Caption tables (`format: csv`, xmr/data/caption_table.py) through the user's commands in a temporary project:
docs/datasets.md's CSV config as printed, the seeded split worked out by hand, and the one-line errors that the
Karpathy reader gives too (an empty caption, a missing image file), naming the file, the entry and what to do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import pytest
import yaml
from PIL import Image

from conftest import REPO, run_xmr

DOC = REPO / "docs" / "datasets.md"


def documented_csv_config() -> str:
    """The ``config/datasets/mycsv.yaml`` block of docs/datasets.md, as printed."""
    [block] = re.findall(r"```yaml\n(# config/datasets/mycsv\.yaml\n.*?)```", DOC.read_text(), flags=re.S)
    return block


def project(tmp: Path, config: str, rows: list[str], table: str = "captions.csv", images: int = 10) -> Path:
    """A project folder: config/datasets/<name>.yaml, a tiny backbone, ``images`` 16-px PNGs 0001.png ... and the
    caption table ``data/mycsv/<table>`` (``rows`` after the header)."""
    (tmp / "config" / "datasets").mkdir(parents=True)
    name = yaml.safe_load(config)["name"]
    (tmp / "config" / "datasets" / f"{name}.yaml").write_text(config)
    (tmp / "config" / "backbones.yaml").write_text(yaml.safe_dump(
        {"eff": {"name": "efficientnet_lite0", "input_size": 32, "batch_size": 16}}))
    folder = tmp / "data" / "mycsv" / "images"
    folder.mkdir(parents=True)
    for k in range(1, images + 1):
        Image.new("RGB", (16, 16), (20 * k, 100, 200 - 15 * k)).save(folder / f"{k:04d}.png")
    (tmp / "data" / "mycsv" / table).write_text("\n".join(rows) + "\n")
    return tmp


def two_captions(n: int = 10, sep: str = ",") -> list[str]:
    rows = [f"filepath{sep}title"]
    for k in range(1, n + 1):
        rows += [f"{k:04d}.png{sep}a picture number {k}", f"{k:04d}.png{sep}image {k} in colour"]
    return rows


def extracted_ids(tmp: Path, dataset: str, split: str) -> list[str]:
    out = tmp / "features" / f"{split}.h5"
    run_xmr("extract", "--dataset", dataset, "--backbone", "eff", "--split", split, "--out", out, "--workers", "0",
            "--threads", "1", "--no-progress", cwd=tmp, check=True)
    with h5py.File(out) as f:
        return [i.decode() if isinstance(i, bytes) else str(i) for i in f["image_ids"][:]]


def test_the_documented_config_assigns_whole_images_by_seed_and_fractions(tmp_path, monkeypatch):
    """By hand: SHA-256 of "0:0001.png" ... "0:0010.png" orders the images 0005, 0009, 0008, 0006, 0002, 0003, 0007,
    0004, 0001, 0010; of 10 images round(0.8 * 10) = 8 go to train, up to round(0.9 * 10) = 9 to val, the rest to
    test: val = 0001, test = 0010, train the other 8, in the order of their first rows."""
    tmp = project(tmp_path, documented_csv_config(), two_captions())
    r = run_xmr("doctor", "mycsv", cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    for split, n in (("train", 8), ("val", 1), ("test", 1)):
        assert re.search(rf"ok +split {split} +data/mycsv/captions\.csv +\({n} images?, {2 * n} captions\)",
                         r.stdout), r.stdout
    assert extracted_ids(tmp, "mycsv", "val") == ["0001.png"]
    assert extracted_ids(tmp, "mycsv", "test") == ["0010.png"]
    from xmr.config.loader import load_dataset_config
    from xmr.data import load_split

    monkeypatch.chdir(tmp)
    train = load_split(load_dataset_config("mycsv"), "train")
    assert train.image_ids == [f"{k:04d}.png" for k in range(2, 10)]
    assert train.captions[:2] == ["a picture number 2", "image 2 in colour"]  # all of an image's captions, in order


def test_split_column_tsv_and_scattered_rows(tmp_path, monkeypatch):
    """A .tsv read with tabs, the split from a column, an image's rows anywhere in the file."""
    config = ("name: mycsv\nformat: csv\nannotations: data/mycsv/captions.tsv\nimages: data/mycsv/images\n"
              "captions_per_image: 2\ncsv: {image_column: path, caption_column: text, split_column: part}\n")
    rows = ["text\tpath\tpart", "first of three\t0003.png\ttest", "one\t0001.png\ttrain", "x, y and z\t0002.png\tval",
            "second of three\t0003.png\ttest", "two\t0001.png\ttrain", "y\t0002.png\tval"]
    tmp = project(tmp_path, config, rows, table="captions.tsv", images=3)
    r = run_xmr("doctor", "mycsv", cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"ok +split val +data/mycsv/captions\.tsv +\(1 images, 2 captions\)", r.stdout), r.stdout
    from xmr.config.loader import load_dataset_config
    from xmr.data import load_split

    monkeypatch.chdir(tmp)
    cfg = load_dataset_config("mycsv")
    test = load_split(cfg, "test")
    assert (test.image_ids, test.captions) == (["0003.png"], ["first of three", "second of three"])
    assert load_split(cfg, "val").captions == ["x, y and z", "y"]


CSV_CONFIG = ("name: mycsv\nformat: csv\nannotations: data/mycsv/captions.csv\nimages: data/mycsv/images\n"
              "captions_per_image: 2\ncsv: {split_column: split}\n")


@pytest.mark.parametrize("config, rows, error", [
    # an empty caption (line 5: header, 2 rows of 0001, then 0002's first)
    (CSV_CONFIG, ["filepath,title,split", "0001.png,a,train", "0001.png,b,train", "0002.png,c,train",
                  '0002.png,"  ",train'],
     "data/mycsv/captions.csv: line 5: empty caption (image 0002.png); write the caption or delete that row"),
    (CSV_CONFIG, ["filepath,title,split", "0001.png,a,train", "0001.png,b,val"],
     "data/mycsv/captions.csv: line 3: image 0001.png is in split 'val' here but 'train' on line 2; give every row of "
     "an image the same split"),
    (CSV_CONFIG, ["filepath;title;split", "0001.png;a;train"],
     "data/mycsv/captions.csv: no column 'filepath' (csv.image_column in the dataset config); the header has "
     "'filepath;title;split'; is csv.separator right?"),
    (CSV_CONFIG, ["filepath,title,split", "0001.png,a,train", "0001.png,b"],
     "data/mycsv/captions.csv: line 3: 2 columns, the header has 3; check csv.separator and quote fields that "
     "contain it"),
    (CSV_CONFIG, ["filepath,title,split", "0001.png,a,train"],
     "data/mycsv/captions.csv: line 2 (0001.png) has 1 captions, fewer than captions_per_image=2; add captions or "
     "lower captions_per_image in config/datasets/mycsv.yaml"),
    (CSV_CONFIG.replace("captions.csv", "captions.txt"), ["filepath,title,split"],
     "data/mycsv/captions.txt: cannot tell the column separator from the extension '.txt'; set csv.separator in the "
     "dataset config (',' or '\\t'), or name the file .csv or .tsv"),
    (CSV_CONFIG.replace("{split_column: split}", "{split_column: split, split_fractions: {train: 1}}"), ["x"],
     "config/datasets/mycsv.yaml: csv: both split_column and split_fractions are set; keep one of them"),
    (CSV_CONFIG.replace("{split_column: split}", "{}"), ["x"],
     "config/datasets/mycsv.yaml: csv: no split; set split_column (a column naming each row's split) or "
     "split_fractions (e.g. {train: 0.8, val: 0.1, test: 0.1})"),
    (CSV_CONFIG.replace("{split_column: split}", "{split_fractions: {train: 0.8, val: 0.1}}"), ["x"],
     "config/datasets/mycsv.yaml: csv.split_fractions: {'train': 0.8, 'val': 0.1} sum to 0.9; make them sum to 1"),
    (CSV_CONFIG.replace("csv: {split_column: split}\n", ""), ["x"],
     "config/datasets/mycsv.yaml: missing required key 'csv'"),
])
def test_a_bad_table_or_config_is_one_line_naming_the_file_and_entry(tmp_path, config, rows, error):
    tmp = project(tmp_path, config, rows, table=yaml.safe_load(config)["annotations"].split("/")[-1], images=2)
    r = run_xmr("doctor", "mycsv", cwd=tmp)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (2, "", f"xmr doctor: error: {error}")


def test_a_missing_image_file_is_the_same_line_for_both_formats(tmp_path):
    """Image 0001.png (the only val image of the documented split) is gone: `xmr extract` names the file, the entry
    listing it, and what to do; the Karpathy JSON's entry is named as images[i]."""
    tmp = project(tmp_path, documented_csv_config(), two_captions())
    (tmp / "data" / "mycsv" / "images" / "0001.png").unlink()
    r = run_xmr("extract", "--dataset", "mycsv", "--backbone", "eff", "--split", "val", "--out", tmp / "val.h5",
                cwd=tmp)
    assert (r.returncode, r.stderr.strip()) == (2, (
        "xmr extract: error: data/mycsv/images/0001.png: image not found (listed at data/mycsv/captions.csv line 2; "
        "1 of 1 images of split val missing); put the file there, or correct that entry or `images:` in "
        "config/datasets/mycsv.yaml")), r.stdout + r.stderr
    doctor = run_xmr("doctor", "mycsv", cwd=tmp)
    assert doctor.returncode == 1
    assert re.search(r"MISSING +image files of split val +data/mycsv/images\n +fix: data/mycsv/images/0001\.png: "
                     r"image not found \(listed at data/mycsv/captions\.csv line 2;", doctor.stdout), doctor.stdout
    # the same dataset in the Karpathy JSON: only filename, split, sentences[].raw
    images = [{"filename": f"{k:04d}.png", "split": "val" if k == 1 else "test" if k == 10 else "train",
               "sentences": [{"raw": f"a picture number {k}"}, {"raw": f"image {k}"}]} for k in range(1, 11)]
    (tmp / "data" / "mycsv" / "dataset.json").write_text(json.dumps({"images": images}))
    (tmp / "config" / "datasets" / "myjson.yaml").write_text(
        "name: myjson\nformat: karpathy\nannotations: data/mycsv/dataset.json\nimages: data/mycsv/images\n"
        "captions_per_image: 2\n")
    r = run_xmr("extract", "--dataset", "myjson", "--backbone", "eff", "--split", "val", "--out", tmp / "v.h5", cwd=tmp)
    assert (r.returncode, r.stderr.strip()) == (2, (
        "xmr extract: error: data/mycsv/images/0001.png: image not found (listed at data/mycsv/dataset.json "
        "images[0]; 1 of 1 images of split val missing); put the file there, or correct that entry or `images:` in "
        "config/datasets/myjson.yaml"))
    images[2]["sentences"][1]["raw"] = " "
    (tmp / "data" / "mycsv" / "dataset.json").write_text(json.dumps({"images": images}))
    r = run_xmr("doctor", "myjson", cwd=tmp)
    assert (r.returncode, r.stderr.strip()) == (2, (
        "xmr doctor: error: data/mycsv/dataset.json: images[2].sentences[1]: empty caption (image 0003.png); write "
        "the caption or delete that sentence"))
