"""Karpathy split JSON reader on fixtures in the real COCO / Flickr30K formats, plus malformed files."""

import json

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.data import load_split


def _img(filename, split, imgid, caps, **extra):
    sents = [{"raw": c, "tokens": c.strip().lower().rstrip(".").split(), "imgid": imgid, "sentid": imgid * 10 + k}
             for k, c in enumerate(caps)]
    return {"filename": filename, "split": split, "imgid": imgid, "sentids": [s["sentid"] for s in sents],
            "sentences": sents, **extra}


def _coco(tmp_path):
    """dataset_coco.json shape: filepath train2014/val2014, cocoid, splits train/restval/val/test."""
    five = [f"caption {k} of the image." for k in range(5)]
    images = [
        _img("COCO_val2014_000000391895.jpg", "test", 0, five, filepath="val2014", cocoid=391895),
        _img("COCO_train2014_000000000009.jpg", "train", 1, [" A plate of food. "] + five[1:], filepath="train2014",
             cocoid=9),
        _img("COCO_val2014_000000522418.jpg", "restval", 2, five + ["a sixth caption.", "a seventh."],
             filepath="val2014", cocoid=522418),
        _img("COCO_val2014_000000184613.jpg", "val", 3, five, filepath="val2014", cocoid=184613),
        _img("COCO_train2014_000000000025.jpg", "train", 4, five, filepath="train2014", cocoid=25),
    ]
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    cfg = {"name": "coco", "format": "karpathy", "annotations": str(path), "images": str(tmp_path / "images"),
           "captions_per_image": 5, "splits": {"train": ["train", "restval"], "val": ["val"], "test": ["test"]}}
    return cfg, images


def test_coco_format_train_gathers_restval_with_cocoids_and_filepaths(tmp_path):
    cfg, images = _coco(tmp_path)
    train = load_split(cfg, "train")
    # JSON order, train + restval, COCO ids as image ids
    assert train.image_ids == ["9", "522418", "25"]
    assert train.image_paths == [tmp_path / "images" / "train2014" / "COCO_train2014_000000000009.jpg",
                                 tmp_path / "images" / "val2014" / "COCO_val2014_000000522418.jpg",
                                 tmp_path / "images" / "train2014" / "COCO_train2014_000000000025.jpg"]
    assert train.num_captions == 15 and train.captions_per_image == 5
    assert train.captions[0] == "A plate of food."  # stripped
    assert train.captions[5:10] == [f"caption {k} of the image." for k in range(5)]  # 7 captions -> first 5
    assert train.tokens[0] == ["a", "plate", "of", "food"]  # the file's own tokens
    np.testing.assert_array_equal(train.caption_image, [0] * 5 + [1] * 5 + [2] * 5)
    assert train.image_labels is None and "boxes" not in train.extra
    test = load_split(cfg, "test")
    assert test.image_ids == ["391895"] and test.num_captions == 5


def test_flickr_format_uses_imgid_and_no_filepath(tmp_path):
    caps = [f"a dog runs number {k}" for k in range(5)]
    images = [_img("1000092795.jpg", "train", 0, caps), _img("10002456.jpg", "test", 1, caps),
              _img("1000268201.jpg", "test", 2, caps)]
    for img in images:
        for s in img["sentences"]:
            del s["tokens"]  # tokens are optional: the reader tokenises raw
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": images}))
    cfg = {"name": "f30k", "format": "karpathy", "annotations": str(path), "images": str(tmp_path / "fl"),
           "captions_per_image": 5}
    test = load_split(cfg, "test")
    assert test.image_ids == ["1", "2"]
    assert test.image_paths == [tmp_path / "fl" / "10002456.jpg", tmp_path / "fl" / "1000268201.jpg"]
    assert test.tokens[0] == ["a", "dog", "runs", "number", "0"]


def test_synth_objects_become_boxes_and_labels(tmp_path):
    caps = ["x"] * 5
    images = [_img("a.png", "train", 0, caps, label=2, objects=[{"box": [1, 2, 30, 40]}, {"box": [5, 5, 9, 9.5]}]),
              _img("b.png", "train", 1, caps, label=0, objects=[])]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"images": images}))
    split = load_split({"name": "s", "format": "karpathy", "annotations": str(path), "images": str(tmp_path),
                        "captions_per_image": 5}, "train")
    np.testing.assert_array_equal(split.image_labels, [2, 0])
    np.testing.assert_array_equal(split.extra["boxes"][0], [[1, 2, 30, 40], [5, 5, 9, 9.5]])
    assert split.extra["boxes"][1].shape == (0, 4)


@pytest.mark.parametrize("content, expected", [
    ('{"images": [\n  {"filename": "a.jpg",\n  "split": }\n]}', "line 3"),
    ('{"imgs": []}', "top-level 'images' list"),
    ('{"images": [{"filename": "a.jpg", "split": "test", "sentences": []}, {"filename": "b.jpg", "sentences": []}]}',
     "images[1] has no 'split' field"),
    ('{"images": [{"filename": "a.jpg", "split": "test", "sentences": [{"raw": "x"}, {"tokens": []}]}]}',
     "images[0].sentences[1] has no 'raw' text"),
    ('{"images": [{"filename": "a.jpg", "split": "test", "sentences": [], "objects": [{"box": [1, 2, 3]}]}]}',
     "images[0].objects[0].box"),
])
def test_malformed_json_names_file_and_place(tmp_path, content, expected):
    path = tmp_path / "bad.json"
    path.write_text(content)
    cfg = {"name": "x", "format": "karpathy", "annotations": str(path), "images": str(tmp_path),
           "captions_per_image": 1}
    with pytest.raises(XmrError) as e:
        load_split(cfg, "test")
    assert str(path) in str(e.value) and expected in str(e.value)


def test_too_few_captions_duplicate_ids_and_empty_split(tmp_path):
    cfg, images = _coco(tmp_path)
    images[3]["sentences"] = images[3]["sentences"][:4]
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": images}))
    with pytest.raises(XmrError, match=r"images\[3\] \(COCO_val2014_000000184613.jpg\) has 4 captions"):
        load_split(cfg, "val")
    images[3]["sentences"] = images[0]["sentences"]
    images[4]["cocoid"] = 9
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": images}))
    with pytest.raises(XmrError, match=r"images\[4\] repeats image id 9 of images\[1\]"):
        load_split(cfg, "train")
    with pytest.raises(XmrError, match=r"no images in split 'dev'.*\['restval', 'test', 'train', 'val'\]"):
        load_split(cfg, "dev")
    with pytest.raises(XmrError, match="not found"):
        load_split({**cfg, "annotations": str(tmp_path / "missing.json")}, "test")


def test_free_text_is_tokenised_as_the_training_vocabulary_expects():
    from xmr.data.karpathy import tokenize, tokenize_for

    # a Karpathy vocabulary has no punctuation: the same tokens as tokenize()
    assert tokenize_for("A dog, on the grass.", {"a", "dog", "on", "the", "grass"}) == \
        tokenize("A dog, on the grass.") == ["a", "dog", "on", "the", "grass"]
    # synth's vocabulary holds ',' and the whole word 'shapes:' (its tokens are the caption split at spaces)
    assert tokenize_for("shapes: a red cross, a Ring", {"shapes:", ",", "a", "red", "cross", "ring"}) == \
        ["shapes:", "a", "red", "cross", ",", "a", "ring"]
