"""Importers: SCAN precomp folders and bottom-up-attention TSVs -> xmr's HDF5 layout, on generated fixtures."""

import base64
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from xmr.cli import main as xmr_main
from xmr.core.errors import XmrError
from xmr.data import load_split
from xmr.features.importers import import_butd_tsv, import_scan, scan_source_split
from xmr.features.store import FeatureFile

from test_datasets_precomp import write_precomp

IDS = ["391895", "9", "522418", "25"]


def _karpathy_coco(tmp_path, order=("25", "391895", "522418", "9"), caption_of=None):
    """A dataset_coco.json whose test split lists the SCAN images in a different order (+ one other image)."""
    caption_of = caption_of or (lambda iid, k: f"Image {iid} caption {k}.")
    images = [{"filename": f"COCO_val2014_{int(i):012d}.jpg", "filepath": "val2014", "cocoid": int(i),
               "imgid": n, "split": "test", "sentences": [{"raw": caption_of(i, k)} for k in range(5)]}
              for n, i in enumerate(order)]
    images.append({"filename": "COCO_train2014_000000000077.jpg", "filepath": "train2014", "cocoid": 77,
                   "imgid": 9, "split": "train", "sentences": [{"raw": "x"}] * 5})
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images}))
    return {"name": "coco", "format": "karpathy", "annotations": str(path), "images": str(tmp_path / "images"),
            "captions_per_image": 5, "splits": {"test": ["test"]}, "extra": {"scan_splits": {"test": "testall"}}}


def _read(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in f}, dict(f.attrs)


def test_scan_import_keeps_source_order_without_a_split(tmp_path):
    ims, _ = write_precomp(tmp_path / "precomp", "testall")
    out = import_scan(tmp_path / "precomp", "testall", tmp_path / "f.h5", progress=False)
    data, attrs = _read(out)
    np.testing.assert_array_equal(data["features"], ims)
    np.testing.assert_array_equal(data["num_regions"], [3, 3, 3, 3])
    assert [s.decode() for s in data["image_ids"]] == IDS
    assert attrs["source_format"] == "scan" and attrs["source_split"] == "testall"
    # the precomp reader gives the same ids, so the pair trains together
    cfg = {"name": "p", "format": "precomp", "root": str(tmp_path / "precomp"), "captions_per_image": 5,
           "splits": {"test": ["testall"]}}
    assert FeatureFile(out).image_ids == load_split(cfg, "test").image_ids


@pytest.mark.parametrize("with_ids", [True, False])
def test_scan_import_reorders_to_the_karpathy_split(tmp_path, with_ids):
    ims, _ = write_precomp(tmp_path / "precomp", "testall")
    if not with_ids:
        (tmp_path / "precomp" / "testall_ids.txt").unlink()  # matched by captions instead
    cfg = _karpathy_coco(tmp_path)
    split = load_split(cfg, "test")
    assert scan_source_split(cfg, "test") == "testall"
    out = import_scan(tmp_path / "precomp", "testall", tmp_path / "f.h5", split=split, dtype="float16",
                      progress=False)
    data, _ = _read(out)
    # Karpathy order 25, 391895, 522418, 9 = SCAN rows 3, 0, 2, 1
    np.testing.assert_array_equal(data["features"], ims[[3, 0, 2, 1]].astype(np.float16))
    assert data["features"].dtype == np.float16
    assert FeatureFile(out).image_ids == split.image_ids == ["25", "391895", "522418", "9"]


def test_scan_import_errors(tmp_path):
    write_precomp(tmp_path / "precomp", "testall")
    cfg = _karpathy_coco(tmp_path, caption_of=lambda iid, k: f"Image {iid} caption {k}!" if iid != "9"
                         else f"Something else {k}")
    split = load_split(cfg, "test")
    with pytest.raises(XmrError, match=r"testall_caps\.txt:6: captions of image 9 differ .*1 of 4 images"):
        import_scan(tmp_path / "precomp", "testall", tmp_path / "f.h5", split=split, progress=False)
    assert not (tmp_path / "f.h5").exists()
    out = import_scan(tmp_path / "precomp", "testall", tmp_path / "f.h5", split=split, verify_captions=False,
                      progress=False)
    assert FeatureFile(out).image_ids == split.image_ids
    (tmp_path / "precomp" / "testall_ids.txt").write_text("391895\n9\n522418\n26\n")
    with pytest.raises(XmrError, match=r"testall_ids\.txt:4: image id 26 is not in coco/test"):
        import_scan(tmp_path / "precomp", "testall", tmp_path / "g.h5", split=split, progress=False)
    (tmp_path / "precomp" / "testall_ids.txt").unlink()
    with pytest.raises(XmrError, match=r"testall_caps\.txt:6: the captions of image row 1 match no image"):
        import_scan(tmp_path / "precomp", "testall", tmp_path / "g.h5", split=split, progress=False)


def _f32(a):
    return base64.b64encode(np.asarray(a, np.float32).tobytes()).decode()


def _tsv_record(iid, w, h, k, dim=6, seed=0, py3_bytes=False):
    rng = np.random.default_rng(seed)
    boxes = np.sort(rng.uniform(0, min(w, h), size=(k, 2, 2)), axis=1).reshape(k, 4)[:, [0, 2, 1, 3]]
    feats = rng.normal(size=(k, dim)).astype(np.float32)
    fb, ff = _f32(boxes), _f32(feats)
    if py3_bytes:
        fb, ff = f"b'{fb}'", f"b'{ff}'"
    return [str(iid), str(w), str(h), str(k), fb, ff], boxes.astype(np.float32), feats


def _write_tsv(path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows))


def test_butd_tsv_adaptive_boxes_are_padded(tmp_path):
    recs = [_tsv_record("391895", 640, 480, 2, seed=1), _tsv_record("9", 500, 375, 3, seed=2, py3_bytes=True),
            _tsv_record("25", 427, 640, 1, seed=3)]
    _write_tsv(tmp_path / "a.tsv.0", [r[0] for r in recs[:2]])
    _write_tsv(tmp_path / "a.tsv.1", [recs[2][0]])
    out = import_butd_tsv([tmp_path / "a.tsv.0", tmp_path / "a.tsv.1"], tmp_path / "f.h5", progress=False)
    data, attrs = _read(out)
    assert data["features"].shape == (3, 3, 6)
    np.testing.assert_array_equal(data["num_regions"], [2, 3, 1])
    for i, (_, boxes, feats) in enumerate(recs):
        k = len(boxes)
        np.testing.assert_array_equal(data["features"][i, :k], feats)
        np.testing.assert_array_equal(data["features"][i, k:], 0)
        np.testing.assert_array_equal(data["boxes"][i, :k], boxes)
    np.testing.assert_array_equal(data["image_wh"], [[640, 480], [500, 375], [427, 640]])
    assert [s.decode() for s in data["image_ids"]] == ["391895", "9", "25"]
    assert attrs["source_format"] == "butd_tsv"


def test_butd_tsv_matched_to_split_by_id_or_file_stem(tmp_path):
    cfg = _karpathy_coco(tmp_path)
    split = load_split(cfg, "test")  # order 25, 391895, 522418, 9
    recs = {i: _tsv_record(i, 640, 480, 2 + n, seed=n) for n, i in enumerate(["9", "77", "522418", "391895", "25"])}
    _write_tsv(tmp_path / "coco.tsv", [recs[i][0] for i in ["9", "77", "522418", "391895", "25"]])
    out = import_butd_tsv([tmp_path / "coco.tsv"], tmp_path / "f.h5", split=split, progress=False)
    data, _ = _read(out)
    assert FeatureFile(out).image_ids == ["25", "391895", "522418", "9"]  # 77 (a train image) skipped
    for row, iid in enumerate(split.image_ids):
        _, boxes, feats = recs[iid]
        np.testing.assert_array_equal(data["features"][row, : len(feats)], feats)
        assert data["num_regions"][row] == len(feats)
    # Flickr30K TSVs use the file stem as image id; the LXMERT column order has img_h before img_w
    images = [{"filename": f"{s}.jpg", "imgid": n, "split": "test", "sentences": [{"raw": "x"}]}
              for n, s in enumerate(["1000092795", "10002456"])]
    (tmp_path / "f30k.json").write_text(json.dumps({"images": images}))
    f30k = load_split({"name": "f30k", "format": "karpathy", "annotations": str(tmp_path / "f30k.json"),
                       "images": str(tmp_path), "captions_per_image": 1}, "test")
    rows = []
    for stem, (w, h) in (("10002456", (500, 333)), ("1000092795", (333, 500))):
        r, _, _ = _tsv_record(stem, w, h, 2)
        rows.append([r[0], str(h), str(w), "", "", "", "", r[3], r[4], r[5]])
    _write_tsv(tmp_path / "lxmert.tsv", rows)
    out = import_butd_tsv([tmp_path / "lxmert.tsv"], tmp_path / "g.h5", split=f30k, progress=False)
    assert FeatureFile(out).image_ids == ["0", "1"]
    np.testing.assert_array_equal(FeatureFile(out).image_sizes(), [[333, 500], [500, 333]])


def test_malformed_tsv_names_file_and_line(tmp_path):
    good = [_tsv_record(str(i), 100, 80, 2, seed=i)[0] for i in range(3)]

    def check(rows, pattern, **kw):
        _write_tsv(tmp_path / "bad.tsv", rows)
        with pytest.raises(XmrError, match=pattern):
            import_butd_tsv([tmp_path / "bad.tsv"], tmp_path / "out.h5", progress=False, **kw)
        assert not (tmp_path / "out.h5").exists()

    check([good[0], good[1][:5]], r"bad\.tsv:2: 5 tab-separated columns")
    check([good[0], good[1][:5] + ["!!notbase64"]], r"bad\.tsv:2: column 'features' is not valid base64")
    check([good[0], good[1][:5] + [_f32(np.zeros(7))]], r"bad\.tsv:2: 'features' holds 7 floats, not a multiple")
    check([good[0], good[1][:4] + [_f32(np.zeros(4))] + good[1][5:]], r"bad\.tsv:2: 'boxes' holds 4 floats")
    check([good[0], good[1][:3] + ["two"] + good[1][4:]], r"bad\.tsv:2: column 'num_boxes' is 'two'")
    check([good[0], good[1], good[0]], r"bad\.tsv:3: image 0 again \(first at .*bad\.tsv:1")
    check([good[0], _tsv_record("1", 100, 80, 2, dim=5)[0]], r"bad\.tsv:2: 5-d features, but .*bad\.tsv:1 has 6-d")
    images = [{"filename": f"{i}.jpg", "imgid": i, "split": "test", "sentences": [{"raw": "x"}]} for i in range(4)]
    (tmp_path / "d.json").write_text(json.dumps({"images": images}))
    split = load_split({"name": "d", "format": "karpathy", "annotations": str(tmp_path / "d.json"),
                        "images": str(tmp_path), "captions_per_image": 1}, "test")
    check(good, r"bad\.tsv: 3 of 4 images of d/test found \(e\.g\. image id 3 is missing\)", split=split)


def test_import_features_cli(tmp_path, capsys):
    ims, _ = write_precomp(tmp_path / "precomp", "testall")
    cfg = _karpathy_coco(tmp_path)
    (tmp_path / "config" / "datasets").mkdir(parents=True)
    (tmp_path / "config" / "datasets" / "coco.yaml").write_text(json.dumps(cfg))
    out = tmp_path / "features" / "coco" / "scan_butd36" / "test.h5"
    rc = xmr_main(["import-features", "--format", "scan", "--src", str(tmp_path / "precomp"), "--dataset", "coco",
                   "--split", "test", "--config-dir", str(tmp_path / "config"), "--out", str(out), "--no-progress"])
    assert rc == 0 and FeatureFile(out).image_ids == ["25", "391895", "522418", "9"]  # src split from the config
    np.testing.assert_array_equal(FeatureFile(out)[0], ims[3])
    assert capsys.readouterr().err == f"xmr import-features: made the folder {out.parent}/ for --out (it did not exist)\n"
    (tmp_path / "bad.tsv").write_text("1\t2\t3\n")
    rc = xmr_main(["import-features", "--format", "butd_tsv", "--src", str(tmp_path / "bad.tsv"), "--out",
                   str(tmp_path / "x.h5"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.tsv:1: 3 tab-separated columns" in err and len(err.strip().splitlines()) == 1


def test_scan_download_alone_trains_and_scores(tmp_path):
    """A user with only the SCAN folder (no JSON, no images): `precomp` dataset + imported features train."""
    import yaml

    from xmr.run.config import load_run_config
    from xmr.train.trainer import train
    from xmr.inference.model import score_split

    rng = np.random.default_rng(0)
    words = ["dog", "cat", "man", "red", "ball", "runs", "sits", "beach", "grass", "sofa"]
    src = tmp_path / "cocoprecomp" / "precomp"
    for split, n in (("train", 12), ("dev", 4), ("testall", 4)):
        write_precomp(src, split, ids=[f"{split}{i}" for i in range(n)], seed=n)
        (src / f"{split}_caps.txt").write_text("".join(" ".join(rng.choice(words, 5)) + "\n" for _ in range(5 * n)))
    cfg_dir = tmp_path / "config"
    (cfg_dir / "datasets").mkdir(parents=True)
    (cfg_dir / "datasets" / "cocoprecomp.yaml").write_text(yaml.safe_dump({
        "name": "cocoprecomp", "format": "precomp", "root": str(src), "captions_per_image": 5,
        "splits": {"train": ["train"], "val": ["dev"], "test": ["testall"]}, "protocols": ["coco1k"]}))
    (cfg_dir / "backbones.yaml").write_text(yaml.safe_dump({"butd_r101_k36": {"name": "butd_detectron2"}}))
    feats = tmp_path / "features"
    for xmr_split, s in (("train", "train"), ("val", "dev"), ("test", "testall")):
        import_scan(src, s, feats / "cocoprecomp" / "butd_r101_k36" / f"{xmr_split}.h5", progress=False)
    recipe = cfg_dir / "recipes" / "cocoprecomp" / "vsepp.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(yaml.safe_dump({
        "extends": str(Path(__file__).resolve().parents[1] / "config" / "methods" / "vsepp.yaml"),
        "dataset": "cocoprecomp", "features": {"backbone": "butd_r101_k36", "dir": str(feats)},
        "model": {"embed_dim": 16}, "text": {"word_vectors": None, "word_dim": 8},
        "train": {"epochs": 1, "batch_size": 8}, "tracking": {"enabled": False}}))
    cfg = load_run_config(recipe)
    summary = train(cfg, tmp_path / "run", progress=False)
    assert summary["best_epoch"] == 1
    sims, info = score_split(tmp_path / "run", progress=False)
    assert sims.shape == (4, 20) and info["split"] == "test" and np.isfinite(sims).all()


# -- the public dev layout: one feature row per caption, dev_ids.txt repeating each id ---------------------

def write_dev_per_caption(folder, ids=IDS, with_ids=True, seed=1):
    """SCAN's coco_precomp/f30k_precomp dev layout: dev_ims.npy has one row per caption (each image's row
    repeated 5 times, consecutive), dev_ids.txt one id per caption, dev_caps.txt 5 lines per image."""
    folder.mkdir(parents=True, exist_ok=True)
    per_image = np.random.default_rng(seed).normal(size=(len(ids), 3, 5)).astype(np.float32)
    np.save(folder / "dev_ims.npy", np.repeat(per_image, 5, axis=0))
    caps = [f"Image {iid} caption {k}." for iid in ids for k in range(5)]
    (folder / "dev_caps.txt").write_text("\n".join(caps) + "\n")
    if with_ids:
        (folder / "dev_ids.txt").write_text("\n".join(i for i in ids for _ in range(5)) + "\n")
    return per_image, caps


@pytest.mark.parametrize("with_ids", [True, False])
def test_scan_dev_one_row_per_caption_is_collapsed(tmp_path, with_ids):
    per_image, caps = write_dev_per_caption(tmp_path / "precomp", with_ids=with_ids)
    cfg = {"name": "p", "format": "precomp", "root": str(tmp_path / "precomp"), "captions_per_image": 5,
           "splits": {"val": ["dev"]}}
    split = load_split(cfg, "val")
    want_ids = IDS if with_ids else ["0", "1", "2", "3"]  # without ids: vse_infty's rows // 5
    assert split.image_ids == want_ids and split.num_images == 4
    assert split.captions == caps  # file order kept
    np.testing.assert_array_equal(split.caption_image, np.repeat(np.arange(4), 5))
    out = import_scan(tmp_path / "precomp", "dev", tmp_path / "f.h5", progress=False)
    data, _ = _read(out)
    assert data["features"].shape == (4, 3, 5)
    np.testing.assert_array_equal(data["features"], per_image)  # row 5k of the file = image k
    assert [s.decode() for s in data["image_ids"]] == want_ids
    assert FeatureFile(out).image_ids == split.image_ids


def test_scan_dev_per_caption_matched_to_karpathy_split(tmp_path):
    per_image, _ = write_dev_per_caption(tmp_path / "precomp")
    cfg = _karpathy_coco(tmp_path)
    cfg["extra"]["scan_splits"] = {"test": "dev"}
    split = load_split(cfg, "test")
    out = import_scan(tmp_path / "precomp", "dev", tmp_path / "f.h5", split=split, progress=False)
    data, _ = _read(out)
    order = {iid: k for k, iid in enumerate(IDS)}
    np.testing.assert_array_equal(data["features"], per_image[[order[i] for i in split.image_ids]])


def _assert_nothing_left(tmp_path):
    assert not (tmp_path / "f.h5").exists() and not (tmp_path / "f.h5.parts").exists()


def test_scan_dev_per_caption_rows_that_differ(tmp_path, capsys):
    write_dev_per_caption(tmp_path / "precomp")
    ims = np.load(tmp_path / "precomp" / "dev_ims.npy")
    ims[7, 0, 0] += 1.0  # image "9" (rows 5..9): row 7 differs from row 5
    np.save(tmp_path / "precomp" / "dev_ims.npy", ims)
    with pytest.raises(XmrError, match=r"dev_ims\.npy: rows 5 and 7 hold different features for image 9 "
                                       r"\(dev_ids\.txt lines 6 and 8\)"):
        import_scan(tmp_path / "precomp", "dev", tmp_path / "f.h5", progress=False, block=2)
    _assert_nothing_left(tmp_path)
    rc = xmr_main(["import-features", "--format", "scan", "--src", str(tmp_path / "precomp"), "--src-split", "dev",
                   "--out", str(tmp_path / "f.h5"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "image 9" in err
    _assert_nothing_left(tmp_path)


def test_scan_dev_per_caption_uneven_ids(tmp_path):
    write_dev_per_caption(tmp_path / "precomp")
    ids = [i for i in IDS for _ in range(5)]
    ids[9] = "522418"  # image 9 on 4 rows, image 522418 on 6
    (tmp_path / "precomp" / "dev_ids.txt").write_text("\n".join(ids) + "\n")
    with pytest.raises(XmrError, match=r"dev_ids\.txt:6: image id 9 is on 4 rows \(lines 6, 7, 8, 9\), the "
                                       r"others on 5"):
        import_scan(tmp_path / "precomp", "dev", tmp_path / "f.h5", progress=False)
    _assert_nothing_left(tmp_path)


def test_scan_2d_ims_needs_pooled(tmp_path, capsys):
    folder = tmp_path / "precomp"
    write_precomp(folder, "testall")
    pooled = np.random.default_rng(3).normal(size=(4, 7)).astype(np.float32)
    np.save(folder / "testall_ims.npy", pooled)
    with pytest.raises(XmrError, match=r"testall_ims\.npy: 2-D array 4 x 7; expected N x R x D region features"):
        import_scan(folder, "testall", tmp_path / "f.h5", progress=False)
    _assert_nothing_left(tmp_path)
    cfg = {"name": "p", "format": "precomp", "root": str(folder), "captions_per_image": 5,
           "splits": {"test": ["testall"]}}
    with pytest.raises(XmrError, match="extra: {pooled: true}"):
        load_split(cfg, "test")
    assert load_split({**cfg, "extra": {"pooled": True}}, "test").num_images == 4
    rc = xmr_main(["import-features", "--format", "scan", "--src", str(folder), "--src-split", "testall",
                   "--out", str(tmp_path / "f.h5"), "--no-progress"])
    assert rc == 2 and "N x R x D" in capsys.readouterr().err
    _assert_nothing_left(tmp_path)
    rc = xmr_main(["import-features", "--format", "scan", "--src", str(folder), "--src-split", "testall",
                   "--out", str(tmp_path / "f.h5"), "--no-progress", "--pooled"])
    data, attrs = _read(tmp_path / "f.h5")
    assert rc == 0 and data["features"].shape == (4, 1, 7) and attrs["pooled"] == 1
    np.testing.assert_array_equal(data["features"][:, 0], pooled)
