"""``train.batch_by: image`` (xmr/train/samplers.py, the trainer): batches of whole images with every caption of
each (kdwonn/DivE data.py), each image encoded once for all its captions, and a loss that never takes an image's
own captions for its negatives."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from xmr.core.errors import XmrError
from xmr.losses.triplet import triplet_loss
from xmr.train.samplers import ImageBatchSampler, first_appearances, positive_mask

REPO = Path(__file__).resolve().parents[1]
# 10 captions of 5 images, not in image order, and not 5 each: image 0 has 3, image 1 one, image 2 three, ...
CAPTION_IMAGE = np.array([2, 0, 1, 0, 3, 2, 4, 0, 2, 3])
CAPTIONS_OF = {i: sorted(np.flatnonzero(CAPTION_IMAGE == i).tolist()) for i in range(5)}


def _images(batch: list[int]) -> list[int]:
    return list(dict.fromkeys(int(CAPTION_IMAGE[j]) for j in batch))


def test_an_image_batch_holds_every_caption_of_each_of_its_images_and_no_image_twice():
    batches = list(ImageBatchSampler(CAPTION_IMAGE, batch_size=2, seed=4))
    assert len(batches) == 3  # ceil(5 images / 2): the last batch holds the one left (the code's DataLoader)
    assert [len(_images(b)) for b in batches] == [2, 2, 1]
    for b in batches:
        assert len(b) == len(set(b))  # no caption twice
        # exactly the captions of the batch's images, grouped by image: no image twice, none of its captions missing
        assert b == [j for i in _images(b) for j in CAPTIONS_OF[i]]


def test_an_image_epoch_covers_every_image_once_and_is_seeded():
    def epoch(seed: int) -> list[int]:
        return [i for b in ImageBatchSampler(CAPTION_IMAGE, batch_size=2, seed=seed) for i in _images(b)]

    assert sorted(epoch(4)) == [0, 1, 2, 3, 4]
    assert sorted(j for b in ImageBatchSampler(CAPTION_IMAGE, 2, 4) for j in b) == list(range(10))  # every caption
    assert epoch(4) == epoch(4)  # deterministic in the seed
    assert len({tuple(epoch(s)) for s in range(6)}) > 1  # and the order is the seed's


def test_image_batches_split_over_processes_with_equal_full_batches():
    full = ImageBatchSampler(CAPTION_IMAGE, batch_size=2, seed=1, world_size=2)
    ranks = [list(ImageBatchSampler(CAPTION_IMAGE, batch_size=2, seed=1, rank=r, world_size=2)) for r in range(2)]
    # 5 images over 2 processes x 2 images: ceil(5 / 4) = 2 batches each, the order wrapped round to 8 images
    assert [len(r) for r in ranks] == [2, 2] == [len(ImageBatchSampler(CAPTION_IMAGE, 2, 1, r, 2)) for r in range(2)]
    assert full.num_batches == 4
    images = [_images(b) for r in ranks for b in r]
    assert all(len(i) == 2 for i in images)  # every batch full, no image twice in one
    assert set(i for b in images for i in b) == {0, 1, 2, 3, 4}  # together the whole epoch
    order = np.random.default_rng(1).permutation(5)
    wrapped = [int(order[k % 5]) for k in range(8)]  # the seed's order, wrapped round
    assert [ranks[b % 2][b // 2] for b in range(4)] == [
        [j for i in wrapped[2 * b:2 * b + 2] for j in CAPTIONS_OF[i]] for b in range(4)]


def test_more_images_per_batch_than_the_split_has_is_refused():
    with pytest.raises(XmrError, match=r"train.batch_size: 6 images per batch \(train.batch_by: image\), but the "
                                       r"training split has 5 images"):
        ImageBatchSampler(CAPTION_IMAGE, batch_size=6, seed=0)


def test_the_loss_of_an_image_batch_masks_an_images_own_captions():
    """Images A (captions a1, a2) and B (b1, b2): one row per pair, rows [A, A, B, B], columns [a1, a2, b1, b2].
    With the image's captions positives, the hardest negatives are other images' captions (i2t) and other images
    (t2i), as kdwonn/DivE's loss.py over its 2 x 4 image-caption matrix; margin 0.2:
      i2t  (A, a1): max(.2+.45-.9, .2+.1-.9, 0) = 0     (A, a2): .2+.45-.5 = .15
           (B, b1): max(.2+.2-.8, .2+.6-.8, 0) = 0       (B, b2): .2+.6-.7 = .1
      t2i  a1: .2+.2-.9 < 0 -> 0   a2: .2+.6-.5 = .3   b1: .2+.45-.8 < 0 -> 0   b2: .2+.1-.7 < 0 -> 0
    sum .55 (the code's mean over 4 + mean over 4 = .55 / 4). Masking only the diagonal, (A, a2) would take a1
    (.2+.9-.5 = .6) for its hardest negative."""
    s = {("A", "a1"): .9, ("A", "a2"): .5, ("A", "b1"): .45, ("A", "b2"): .1,
         ("B", "a1"): .2, ("B", "a2"): .6, ("B", "b1"): .8, ("B", "b2"): .7}
    rows, cols = ["A", "A", "B", "B"], ["a1", "a2", "b1", "b2"]
    sims = torch.tensor([[s[(r, c)] for c in cols] for r in rows])
    image_index = torch.tensor([7, 7, 3, 3])  # dataset indices of the pairs' images, as the image batch gives them
    assert first_appearances(image_index.tolist()) == ([7, 3], [0, 0, 1, 1])
    mask = positive_mask(image_index, None, "image", True)
    t, f = True, False
    assert mask.tolist() == [[t, t, f, f], [t, t, f, f], [f, f, t, t], [f, f, t, t]]
    assert triplet_loss(sims, mask, 0.2, True, "sum").item() == pytest.approx(.55)
    assert triplet_loss(sims, mask, 0.2, True, "mean_negatives").item() == pytest.approx(.55 / 4)
    eye = torch.eye(4, dtype=torch.bool)  # only the diagonal: the own captions become negatives
    assert triplet_loss(sims, eye, 0.2, True, "sum").item() == pytest.approx(1.9)


def test_image_batches_need_same_image_positives_and_random_sampling():
    from xmr.run.config import load_run_config
    from xmr.settings.run_settings import run_settings
    from xmr.train.samplers import check_batching

    cfg = load_run_config(REPO / "config/recipes/synth/vsepp.yaml", ["train.batch_by=image",
                                                                       "train.mask_same_image=false"])
    with pytest.raises(XmrError, match="train.batch_by: image puts every caption of an image in its batch, and "
                                       "train.mask_same_image: false would make them negatives"):
        check_batching(run_settings(cfg).batching, None, "run", "synth")
    cfg = load_run_config(REPO / "config/recipes/synth/vsepp.yaml", ["train.batch_by=image",
                                                                       "train.sampler=one_per_class"])
    with pytest.raises(XmrError, match="train.batch_by: image draws whole images, train.sampler: one_per_class"):
        check_batching(run_settings(cfg).batching, None, "run", "synth")


def _tiny(tiny_synth, method: str, **sections):
    from xmr.inference.model import model_from_config
    from xmr.run.config import load_run_config
    from xmr.text.vocab import SPECIALS

    cfg = load_run_config(tiny_synth.recipe(method, name=f"{method}_by_image", text={"word_vectors": None,
                                                                                     "word_dim": 8}, **sections))
    torch.manual_seed(0)
    return model_from_config(cfg, 8, [*SPECIALS, "red", "ball", "big"]), cfg


def test_each_image_is_encoded_once_for_all_of_its_captions(tiny_synth):
    """Training mode with the region drop at p = 0.5 and dropout: the image side of the forward is one encoding
    of each distinct image, repeated for its captions (per-pair encodings would each draw their own drop)."""
    from xmr.train.step import TrainForward

    model, _ = _tiny(tiny_synth, "dive", model={"num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 4,
                                                "size_augment": {"mode": "region", "p": 0.5}})
    feats = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(1))  # the batch's two images, once each
    nr = torch.tensor([6, 5])
    caps = ["red ball", "big ball", "ball", "big red ball", "red"]
    text = model.text.collate(caps, [c.split() for c in caps])
    rows = torch.tensor([0, 0, 0, 1, 1])  # 3 captions of the first image, 2 of the second
    model.train()
    torch.manual_seed(2)
    out = TrainForward(model)(feats, nr, text, torch.tensor([5, 5, 5, 9, 9]), rows)
    assert out["img"].shape[0] == out["txt"].shape[0] == 5 == out["image_slots"].shape[0]
    torch.manual_seed(2)  # the same draws: the image side first, once per image, then the captions
    images = model.image_outputs(feats, nr)
    assert torch.equal(out["img"], images["img"][rows]) and torch.equal(out["image_slots"], images["image_slots"][rows])
    assert torch.equal(out["txt"], model.text_outputs(text)["txt"])
    torch.manual_seed(2)
    per_pair = model(feats[rows], nr[rows], text)["img"]  # what caption-indexed pairs would encode
    assert not torch.equal(per_pair[0], per_pair[1])  # (each copy its own drop: the test can tell the two apart)


def test_an_image_indexed_epoch_loads_each_image_once_with_all_of_its_captions(tiny_synth, tmp_path):
    """The trainer's own loader of an image-indexed epoch on the tiny synthetic set (48 images, 5 captions each):
    16 images a batch, 80 pairs, each image's features once; every image in one batch of the epoch."""
    from xmr.run.config import load_run_config
    from xmr.train import distributed as dist
    from xmr.train.trainer import TrainState, epoch_loader, set_up, start_epochs

    cfg = load_run_config(tiny_synth.recipe("vsepp", name="vsepp_by_image", train={"batch_by": "image",
                                                                                    "batch_size": 16}))
    run = set_up(cfg, tmp_path / "run", dist.DistContext())
    start_epochs(run, TrainState())
    assert run.steps_per_epoch == 3
    seen = []
    data = run.train_data
    for batch in epoch_loader(run, 0):
        idx, rows = batch["image_index"], batch["image_rows"]
        images = list(dict.fromkeys(idx.tolist()))
        assert batch["feats"].shape[0] == len(images) == 16 and len(idx) == 80
        assert torch.equal(idx, torch.tensor(images)[rows])  # each pair's row is its own image's
        assert sorted(batch["caption_index"].tolist()) == sorted(
            j for i in images for j in np.flatnonzero(data.caption_image == i).tolist())
        assert torch.equal(batch["feats"][0, :batch["num_regions"][0]],
                           torch.as_tensor(run.train_feats[images[0]][:int(batch["num_regions"][0])]).float())
        seen += images
    assert sorted(seen) == list(range(48))


def test_an_end_to_end_image_batch_carries_each_images_pixels_once(tiny_synth):
    """features.source: images: the batch's pixels once per image (``images``, no region counts), each pair's
    ``image_rows`` pointing at its image's, every caption there."""
    from xmr.config.loader import load_dataset_config
    from xmr.data import load_split
    from xmr.inference.loaders import ImageFiles
    from xmr.train.samplers import ImageIndexedCollate, ImageIndexedPairs

    data = load_split(load_dataset_config("synth", tiny_synth.config_dir), "train")
    files = ImageFiles(data.image_paths, 32)
    pairs = ImageIndexedPairs(data, files)
    js = [j for i in (4, 1) for j in np.flatnonzero(data.caption_image == i).tolist()]
    batch = ImageIndexedCollate(lambda caps, toks, idx, split: {"captions": caps}, "train")(pairs.__getitems__(js))
    assert "feats" not in batch and "num_regions" not in batch
    assert batch["images"].shape == (2, 3, 32, 32) and batch["images"].dtype == torch.uint8
    assert torch.equal(batch["images"][0], files[4]) and torch.equal(batch["images"][1], files[1])
    assert batch["image_rows"].tolist() == [0] * 5 + [1] * 5 and batch["image_index"].tolist() == [4] * 5 + [1] * 5
    assert batch["text"]["captions"] == [data.captions[j] for j in js]


def test_xmr_train_batches_by_image_and_resumes(tiny_synth, tmp_path):
    """`xmr train --set train.batch_by=image` on the tiny synthetic set trains DivE: 3 steps of 16 images (80
    pairs) an epoch, a finite loss; a run killed after its first epoch and started again ends as the straight run
    (the epoch's image order is a function of the seed and the epoch)."""
    import signal

    from tests.conftest import history_rows, run_xmr, train_cli

    model = {"num_embeds": 2, "iterations": 1, "heads": 2, "dim_head": 8, "image_global_pool": "mean",
             "image_pos_enc": "sine2d"}
    text = {"word_vectors": None, "word_dim": 8}
    recipe = tiny_synth.recipe("dive", name="dive_by_image", text=text, model=model, train={"epochs": 2})
    r = run_xmr("train", "--config", recipe, "--out-dir", tmp_path / "straight", "--no-progress", "--set",
                "train.batch_by=image", "train.log_every_steps=1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "step=3/3" in r.stderr and "step=4/" not in r.stderr
    rows = history_rows(tmp_path / "straight")
    assert len(rows) == 2 and all(math.isfinite(float(row["loss"])) and float(row["loss"]) > 0 for row in rows)
    same = tiny_synth.recipe("dive", name="dive_by_image_resumed", text=text, model=model,
                             train={"epochs": 2, "batch_by": "image"})
    assert train_cli(same, tmp_path / "resumed", kill_after_first_epoch=True) == -signal.SIGKILL
    assert "resuming" in train_cli(same, tmp_path / "resumed")
    assert history_rows(tmp_path / "resumed") == rows
