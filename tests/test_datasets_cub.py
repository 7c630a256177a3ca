"""CUB Captions reader on a generated fixture in the real CUB-200-2011 + text_c10 layout, plus malformed files."""

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.data import load_split
from xmr.data.cub import BUILTIN_TEST_CLASSES

# 5 classes: 1-3 are train+val, 4 and 12 are in the built-in (Reed/PCME) test list
CLASSES = {1: "001.Black_footed_Albatross", 2: "002.Laysan_Albatross", 3: "003.Sooty_Albatross",
           4: "004.Groove_billed_Ani", 12: "012.Yellow_headed_Blackbird"}
PER_CLASS = 5


def _make_cub(tmp_path):
    root = tmp_path / "cub" / "CUB_200_2011"
    text = tmp_path / "cub" / "text_c10"
    images, labels, iid = [], [], 0
    for cid, folder in CLASSES.items():
        for k in range(PER_CLASS):
            iid += 1
            rel = f"{folder}/{folder.split('.')[1]}_{k:04d}_{iid}.jpg"
            images.append(f"{iid} {rel}")
            labels.append(f"{iid} {cid}")
            (root / "images" / folder).mkdir(parents=True, exist_ok=True)
            (text / folder).mkdir(parents=True, exist_ok=True)
            lines = [f"bird {iid} caption {j}" for j in range(10 + (k == 1))]  # one file has 11 captions
            (text / folder / (rel.split("/")[1][:-4] + ".txt")).write_text("\n".join(lines) + "\n\n")
    root.mkdir(parents=True, exist_ok=True)
    (root / "images.txt").write_text("\n".join(images) + "\n")
    (root / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (root / "classes.txt").write_text("\n".join(f"{c} {n}" for c, n in CLASSES.items()) + "\n")
    cfg = {"name": "cub", "format": "cub", "root": str(tmp_path / "cub"), "images": str(root),
           "captions_per_image": 10, "splits": {"train": ["train"], "val": ["heldout"], "test": ["test"]},
           "extra": {"text_dir": str(text), "test_classes": "builtin", "trainval_classes": None,
                     "heldout_images": 5}}
    return cfg, root, text


def test_builtin_split_is_the_pcme_test_class_list():
    assert len(BUILTIN_TEST_CLASSES) == 50 and len(set(BUILTIN_TEST_CLASSES)) == 50
    assert {4, 12, 200}.issubset(BUILTIN_TEST_CLASSES) and 1 not in BUILTIN_TEST_CLASSES


def test_default_split_class_disjoint_with_every_fifth_image_held_out(tmp_path):
    cfg, root, _ = _make_cub(tmp_path)
    train, val, test = (load_split(cfg, s) for s in ("train", "val", "test"))
    # ids 1..15 are classes 1-3; the 5th image of each (ids 5, 10, 15) is held out
    assert train.image_ids == [str(i) for i in range(1, 16) if i % 5]
    assert val.image_ids == ["5", "10", "15"]
    assert test.image_ids == [str(i) for i in range(16, 26)]
    np.testing.assert_array_equal(test.image_labels, [3] * 5 + [11] * 5)  # class id - 1
    np.testing.assert_array_equal(train.image_labels, [0] * 4 + [1] * 4 + [2] * 4)
    assert train.captions_per_image == 10 and train.num_captions == 120
    assert train.captions[10:20] == [f"bird 2 caption {j}" for j in range(10)]  # 11 lines -> first 10
    assert train.tokens[0] == ["bird", "1", "caption", "0"]
    assert train.image_paths[0] == root / "images" / "001.Black_footed_Albatross" / "Black_footed_Albatross_0000_1.jpg"
    np.testing.assert_array_equal(train.caption_labels[:11], [0] * 11)
    assert set(train.image_labels).isdisjoint(test.image_labels)


def test_pcme_split_files(tmp_path):
    cfg, root, _ = _make_cub(tmp_path)
    (tmp_path / "trainvalclasses.txt").write_text("001.Black_footed_Albatross\n002.Laysan_Albatross\n")
    (tmp_path / "testclasses.txt").write_text("004.Groove_billed_Ani\n12\n")
    # like PCME's seen_test_images.txt: one entry of a test class, which is ignored
    (tmp_path / "seen.txt").write_text("002.Laysan_Albatross/Laysan_Albatross_0001_7.jpg\n"
                                       "004.Groove_billed_Ani/Groove_billed_Ani_0000_16.jpg\n")
    cfg["extra"].update(trainval_classes=str(tmp_path / "trainvalclasses.txt"),
                        test_classes=str(tmp_path / "testclasses.txt"), heldout_images=str(tmp_path / "seen.txt"))
    assert load_split(cfg, "train").image_ids == [str(i) for i in range(1, 11) if i != 7]
    assert load_split(cfg, "val").image_ids == ["7"]
    assert load_split(cfg, "test").image_ids == [str(i) for i in range(16, 26)]  # image 16 stays in test
    cfg["splits"]["val"] = ["test"]  # PCME's model-selection reading
    assert load_split(cfg, "val").image_ids == [str(i) for i in range(16, 26)]


def test_malformed_cub_files_name_file_and_line(tmp_path):
    cfg, root, text = _make_cub(tmp_path)
    good = (root / "images.txt").read_text()
    lines = good.splitlines()
    lines[2] = "three " + lines[2].split(" ", 1)[1]
    (root / "images.txt").write_text("\n".join(lines))
    with pytest.raises(XmrError, match=r"images\.txt:3: expected '<id> <class folder/file.jpg>'"):
        load_split(cfg, "train")
    (root / "images.txt").write_text(good)

    cap = text / "001.Black_footed_Albatross" / "Black_footed_Albatross_0002_3.txt"
    cap.write_text("\n".join(["only"] * 9))
    with pytest.raises(XmrError, match=r"Black_footed_Albatross_0002_3\.txt: 9 captions, fewer than"):
        load_split(cfg, "train")
    cap.unlink()
    with pytest.raises(XmrError, match=r"Black_footed_Albatross_0002_3\.txt: caption file not found"):
        load_split(cfg, "train")

    (tmp_path / "tc.txt").write_text("004.Groove_billed_Ani\n012.Wrong_Name\n")
    with pytest.raises(XmrError, match=r"tc\.txt:2: '012\.Wrong_Name' does not match classes\.txt"):
        load_split({**cfg, "extra": {**cfg["extra"], "test_classes": str(tmp_path / "tc.txt")}}, "test")
    (tmp_path / "tv.txt").write_text("001.Black_footed_Albatross\n004.Groove_billed_Ani\n")
    with pytest.raises(XmrError, match=r"classes \[4\] are both train\+val and test"):
        load_split({**cfg, "extra": {**cfg["extra"], "trainval_classes": str(tmp_path / "tv.txt")}}, "test")
    (tmp_path / "seen.txt").write_text("\n001.Black_footed_Albatross/nope.jpg\n")
    with pytest.raises(XmrError, match=r"seen\.txt:2: '001\.Black_footed_Albatross/nope\.jpg' is not in images\.txt"):
        load_split({**cfg, "extra": {**cfg["extra"], "heldout_images": str(tmp_path / "seen.txt")}}, "test")
    with pytest.raises(XmrError, match="CUB source split 'dev'"):
        load_split({**cfg, "splits": {"val": ["dev"]}}, "val")


def _auto(cfg):
    """The shipped config/datasets/cub.yaml reading: split settings `auto`, split files looked up in root."""
    for key in ("test_classes", "trainval_classes", "heldout_images"):
        cfg["extra"][key] = "auto"
    return cfg


def test_pcme_split_files_are_followed_by_default(tmp_path, capsys):
    import xmr.data.cub as cub

    cub._announced.clear()
    cfg = _auto(_make_cub(tmp_path)[0])
    split_dir = tmp_path / "cub"  # the dataset root, as PCME's datasets/annotations/cub/ files are copied there
    (split_dir / "trainvalclasses.txt").write_text("001.Black_footed_Albatross\n002.Laysan_Albatross\n")
    (split_dir / "testclasses.txt").write_text("004.Groove_billed_Ani\n012.Yellow_headed_Blackbird\n")
    (split_dir / "seen_test_images.txt").write_text("002.Laysan_Albatross/Laysan_Albatross_0001_7.jpg\n"
                                                    "004.Groove_billed_Ani/Groove_billed_Ani_0000_16.jpg\n")
    train, val, test = (load_split(cfg, s) for s in ("train", "val", "test"))
    # class 3 is in neither list: not used; image 7 held out (PCME's file), not the every-5th images
    assert train.image_ids == [str(i) for i in range(1, 11) if i != 7]
    assert val.image_ids == ["7"] and test.image_ids == [str(i) for i in range(16, 26)]
    assert train.extra["split_rule"].startswith("split files: test_classes=")
    assert train.extra["run_tags"] == {"split_rule": train.extra["split_rule"]}
    assert f"heldout_images={split_dir / 'seen_test_images.txt'}" in train.extra["split_rule"]
    err = capsys.readouterr().err
    assert err.count("CUB splits from the split files") == 1  # said once, not per split


def test_every_fifth_image_is_the_fallback_and_is_recorded(tmp_path, capsys):
    import xmr.data.cub as cub

    cub._announced.clear()
    cfg = _auto(_make_cub(tmp_path)[0])
    val = load_split(cfg, "val")
    assert val.image_ids == ["5", "10", "15"]
    assert val.extra["split_rule"] == ("fallback rule: test_classes=builtin, trainval_classes=None, "
                                       "heldout_images=every 5th image")
    assert "CUB splits from the fallback rule" in capsys.readouterr().err


def test_empty_split_names_the_files_to_provide(tmp_path):
    cfg, root, _ = _make_cub(tmp_path)
    _auto(cfg)
    # a small CUB copy: 4 images per train+val class, so "every 5th image" holds out nothing
    lines = [ln for ln in (root / "images.txt").read_text().splitlines() if int(ln.split()[0]) % 5 or
             int(ln.split()[0]) > 15]
    (root / "images.txt").write_text("\n".join(lines) + "\n")
    assert len(load_split(cfg, "train").image_ids) == 12
    with pytest.raises(XmrError, match=r"split 'val' \(CUB source splits \['heldout'\]\) has no images under the "
                                       r"fallback rule.*put PCME's split files testclasses\.txt, trainvalclasses\.txt, "
                                       r"seen_test_images\.txt \(naver-ai/pcme datasets/annotations/cub/\) in "):
        load_split(cfg, "val")


def test_split_rule_is_recorded_as_a_run_tag(tiny_synth, tmp_path, monkeypatch):
    """The trainer copies a split's ``extra['run_tags']`` (CUB: ``split_rule``) into the tracking run's tags."""
    import contextlib

    import xmr.train.trainer as trainer
    from xmr.run.config import load_run_config

    real = trainer.load_split_images

    def tagged(image, dataset, split, train=False):
        data, feats = real(image, dataset, split, train)
        data.extra["run_tags"] = {"split_rule": "split files: test_classes=x"}
        return data, feats

    seen = {}

    class RecordingTracker:
        run_id = None

        def __init__(self, enabled=True):
            pass

        @contextlib.contextmanager
        def run(self, experiment, run_name, run_id=None, tags=None, parent_run_id=None, **kw):
            seen.update(tags or {})
            yield self

        def __getattr__(self, name):  # log_params, log_metrics, ...: nothing to record here
            return lambda *a, **k: None

    monkeypatch.setattr(trainer, "load_split_images", tagged)
    monkeypatch.setattr(trainer, "Tracker", RecordingTracker)
    trainer.train(load_run_config(tiny_synth.recipe("vsepp", train={"epochs": 1})), tmp_path / "run", progress=False)
    assert seen["split_rule"] == "split files: test_classes=x" and seen["method"] == "vsepp"
