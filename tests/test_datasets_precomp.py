"""``precomp`` reader (SCAN/VSE∞ precomputed folder) on generated fixtures, plus malformed files."""

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.data import load_split


def write_precomp(folder, split, ids=("391895", "9", "522418", "25"), per_caption_ids=False, seed=0):
    """A SCAN-layout split: {split}_ims.npy (N, 3, 5), {split}_caps.txt (5 per image), {split}_ids.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(ids)
    ims = np.random.default_rng(seed).normal(size=(n, 3, 5)).astype(np.float32)
    np.save(folder / f"{split}_ims.npy", ims)
    caps = [f"Image {iid} caption {k}." for iid in ids for k in range(5)]
    (folder / f"{split}_caps.txt").write_text("\n".join(caps) + "\n")
    if ids is not None:
        lines = [i for i in ids for _ in range(5)] if per_caption_ids else list(ids)
        (folder / f"{split}_ids.txt").write_text("\n".join(lines) + "\n")
    return ims, caps


def _cfg(folder, **kw):
    return {"name": "cocoprecomp", "format": "precomp", "root": str(folder), "captions_per_image": 5,
            "splits": {"train": ["train"], "val": ["dev"], "test": ["testall"]}, **kw}


def test_reads_captions_ids_and_maps_splits(tmp_path):
    _, caps = write_precomp(tmp_path, "testall")
    split = load_split(_cfg(tmp_path), "test")
    assert split.image_ids == ["391895", "9", "522418", "25"]
    assert split.captions == caps and split.captions_per_image == 5
    np.testing.assert_array_equal(split.caption_image, np.repeat(np.arange(4), 5))
    assert split.tokens[6] == ["image", "9", "caption", "1"]
    assert split.image_paths == [] and split.extra["source_split"] == "testall"


def test_ids_one_per_caption_and_no_ids_file(tmp_path):
    write_precomp(tmp_path / "a", "dev", per_caption_ids=True)
    assert load_split(_cfg(tmp_path / "a"), "val").image_ids == ["391895", "9", "522418", "25"]
    write_precomp(tmp_path / "b", "dev")
    (tmp_path / "b" / "dev_ids.txt").unlink()
    assert load_split(_cfg(tmp_path / "b"), "val").image_ids == ["0", "1", "2", "3"]  # row numbers


def test_malformed_precomp_files(tmp_path):
    write_precomp(tmp_path, "dev")
    caps = (tmp_path / "dev_caps.txt").read_text().splitlines()
    (tmp_path / "dev_caps.txt").write_text("\n".join(caps[:3] + [""] + caps[4:]))
    with pytest.raises(XmrError, match=r"dev_caps\.txt:4: empty line"):
        load_split(_cfg(tmp_path), "val")
    (tmp_path / "dev_caps.txt").write_text("\n".join(caps[:19]))
    with pytest.raises(XmrError, match=r"dev_caps\.txt: 19 captions for 4 images in dev_ims\.npy"):
        load_split(_cfg(tmp_path), "val")
    (tmp_path / "dev_caps.txt").write_text("\n".join(caps))
    (tmp_path / "dev_ids.txt").write_text("\n".join(["1"] * 5 + ["2"] * 4 + ["3"] + ["4"] * 10))
    with pytest.raises(XmrError, match=r"dev_ids\.txt:6: ids of image row 1 differ"):
        load_split(_cfg(tmp_path), "val")
    (tmp_path / "dev_ids.txt").write_text("1\n2\n2\n3\n")
    with pytest.raises(XmrError, match=r"dev_ids\.txt: image id 2 appears on two image rows"):
        load_split(_cfg(tmp_path), "val")
    (tmp_path / "dev_ids.txt").write_text("1\n2\n3\n4\n")
    (tmp_path / "dev_ims.npy").write_bytes(b"not an npy file")
    with pytest.raises(XmrError, match=r"dev_ims\.npy: not a \.npy array"):
        load_split(_cfg(tmp_path), "val")
    with pytest.raises(XmrError, match=r"testall_caps\.txt: not found .*splits here: \['dev'\]"):
        load_split(_cfg(tmp_path), "test")
    write_precomp(tmp_path, "dev")
    with pytest.raises(XmrError, match="5 captions per image row, but captions_per_image is 10"):
        load_split(_cfg(tmp_path, captions_per_image=10), "val")
    with pytest.raises(XmrError, match="maps to exactly one source split"):
        load_split(_cfg(tmp_path, splits={"val": ["dev", "test"]}), "val")
