"""The batched read of the training loader: one store read per batch gives exactly the batch that per-image
reads stacked into (``read_regions`` against values written by hand into a store); a float16 store's batch
stays float16 until ``image_input`` has moved it to the device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from xmr.data.base import CaptionedSplit
from xmr.features.store import FeatureFile, ShardWriter
from xmr.inference.loaders import ImageDataset, PairCollate, PairDataset, collate_images, image_input, read_regions

COUNTS = [3, 1, 4, 2, 4]  # regions per image; the store holds 4 rows of 2 numbers per image


@pytest.fixture
def store(tmp_path):
    # region r of image i holds (10 i + r, -(10 i + r)): exact in float16. Rows past an image's count hold 999,
    # which a correct read must never show (it pads with zeros).
    feats = np.full((5, 4, 2), 999.0, dtype=np.float32)
    for i, n in enumerate(COUNTS):
        for r in range(n):
            feats[i, r] = (10 * i + r, -(10 * i + r))
    w = ShardWriter(tmp_path / "f.h5", 5, {"backbone": "hand"})
    w.write(0, feats, np.array(COUNTS))
    return w.finish([f"im{i}" for i in range(5)], dtype="float16")


def expected(indices, max_regions=None):
    counts = [min(COUNTS[i], max_regions or 99) for i in indices]
    r = max(counts)
    out = np.zeros((len(indices), r, 2), np.float32)
    for b, (i, n) in enumerate(zip(indices, counts)):
        for k in range(n):
            out[b, k] = (10 * i + k, -(10 * i + k))
    return out, counts


@pytest.mark.parametrize("in_memory", [True, False])
def test_rows_reads_any_order_with_repeats(store, in_memory):
    ff = FeatureFile(store, in_memory=in_memory)
    got = ff.rows([3, 0, 3, 1], 2)
    assert got.dtype == np.float16 and got.shape == (4, 2, 2)
    assert got[:, :, 0].tolist() == [[30, 31], [0, 1], [30, 31], [10, 999]]


@pytest.mark.parametrize("in_memory", [True, False])
@pytest.mark.parametrize("max_regions", [None, 2])
def test_read_regions_pads_crops_and_keeps_order(store, in_memory, max_regions):
    ff = FeatureFile(store, in_memory=in_memory)
    idx = [4, 1, 0, 4, 3]
    feats, counts = read_regions(ff, idx, max_regions)
    want, want_counts = expected(idx, max_regions)
    assert feats.dtype == torch.float16 and counts.tolist() == want_counts  # the store's dtype
    x, n = image_input({"feats": feats, "num_regions": counts}, torch.device("cpu"))
    assert x.dtype == torch.float32 and np.array_equal(x.numpy(), want) and n.tolist() == want_counts


def test_loader_batches_equal_per_image_reads(store):
    # 2 captions per image; the batched __getitems__ path against the per-item __getitem__ path
    data = CaptionedSplit(name="hand", split="train", image_ids=[f"im{i}" for i in range(5)], image_paths=[],
                          captions=[f"c{j}" for j in range(10)], caption_image=np.repeat(np.arange(5), 2))
    ds = PairDataset(data, FeatureFile(store), max_regions=3)
    collate = PairCollate(lambda caps, toks, js, split: caps, "train")
    gen = torch.Generator().manual_seed(0)
    batched = list(DataLoader(ds, batch_size=4, shuffle=True, generator=gen, collate_fn=collate))
    for b in batched:
        per_item = collate([ds[j] for j in b["caption_index"].tolist()])
        assert b["feats"].dtype == torch.float16 and per_item["feats"].dtype == torch.float32
        x, n = image_input(b, torch.device("cpu"))
        assert torch.equal(x, per_item["feats"]) and torch.equal(n, per_item["num_regions"])
        assert torch.equal(b["image_index"], b["caption_index"] // 2)
        assert b["text"] == [f"c{j}" for j in b["caption_index"].tolist()]
    assert sorted(j for b in batched for j in b["caption_index"].tolist()) == list(range(10))
    enc = list(DataLoader(ImageDataset(FeatureFile(store), [2, 0]), batch_size=2, collate_fn=collate_images))
    assert np.array_equal(image_input(enc[0])[0].numpy(), expected([2, 0])[0])
