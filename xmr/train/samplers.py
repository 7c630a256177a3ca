"""Batch composition: which training pairs share a batch, and which of them count as positives.

- ``train.sampler: random`` — shuffled caption-level pairs (every method's reference code for COCO/Flickr30K but
  DivE's, whose batches are whole images: ``train.batch_by: image`` below).
- ``train.sampler: one_per_class`` — PCME's ``CUBSampler`` (naver-ai/pcme ``datasets/cub.py``): each batch is
  one anchor pair plus one random pair from each of ``batch_size - 1`` other classes, so no two pairs of a batch
  share a class and same-class pairs are never in-batch negatives. An epoch has ``len(pairs) // batch_size``
  batches (the released ``adjust_epoch``); anchors are the first pairs of a shuffled order. The released sampler
  needs ``batch_size`` = the number of training classes (150 on CUB); here fewer classes per batch are allowed
  (a random subset of the other classes each batch).
- ``train.batch_by: image`` — :class:`ImageBatchSampler` (kdwonn/DivE ``data.py``: the training set iterates over
  images, each with all of its captions): ``batch_size`` images a batch, every caption of each; each image once an
  epoch, the last batch holding the rest (the code's DataLoader keeps it). :class:`ImageIndexedPairs` reads a
  batch's images once and :class:`ImageIndexedCollate` says which image each pair has (``image_rows``); the trainer
  encodes each image once and repeats its outputs for each of its captions, so the loss gets one row per pair, and
  same-image captions are positives (``train.mask_same_image: true``, required): a caption's only positive image is
  its own, and an image's own captions are never its negatives.
- ``train.positives: image | class | caption_text`` — the in-batch positive mask given to the loss: captions of
  the same image (``image``), of the same class (``class``: "all image-caption pairs of the same class are
  positives", the CUB reading of DVSE's card), or, for image i and caption j, captions whose text equals one of
  image i's own captions (``caption_text``: a duplicated generic caption such as "a man riding a horse" is not a
  negative for any image it describes word for word; same-image captions stay positives);
  ``train.mask_same_image: false`` keeps only the pair itself as positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

from xmr.core.errors import XmrError
from xmr.data.base import CaptionedSplit
from xmr.inference.loaders import ImageFiles, PairCollate, PairDataset, RegionBatch, read_regions
from xmr.settings.run_settings import Batching

SAMPLERS = ("random", "one_per_class")
POSITIVES = ("image", "class", "caption_text")
BATCH_BY = ("caption", "image")


class OnePerClassBatchSampler(Sampler[list[int]]):
    """Batches of pair indices with pairwise distinct classes (see the module docstring). Deterministic in
    ``seed``; with ``world_size`` > 1 each rank takes every ``world_size``-th batch."""

    def __init__(self, pair_classes: np.ndarray, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        self.pair_classes = np.asarray(pair_classes)
        classes = np.unique(self.pair_classes)
        if batch_size > len(classes):
            raise XmrError(f"train.batch_size: {batch_size} > {len(classes)} training classes; one_per_class "
                           f"needs at most one pair per class in a batch (PCME: batch_size = number of classes)")
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.by_class = {int(c): np.flatnonzero(self.pair_classes == c) for c in classes}
        self.num_batches = len(self.pair_classes) // batch_size

    def __len__(self) -> int:
        return len(range(self.rank, self.num_batches, self.world_size))

    def __iter__(self) -> Iterator[list[int]]:
        rng = np.random.default_rng(self.seed)
        anchors = rng.permutation(len(self.pair_classes))[:self.num_batches]
        classes = np.array(sorted(self.by_class))
        for b, anchor in enumerate(anchors):
            others = classes[classes != self.pair_classes[anchor]]
            picked = rng.choice(others, size=self.batch_size - 1, replace=False)
            batch = [int(anchor)] + [int(rng.choice(self.by_class[int(c)])) for c in picked]
            order = rng.permutation(len(batch))
            if b % self.world_size == self.rank:
                yield [batch[i] for i in order]


class ImageBatchSampler(Sampler[list[int]]):
    """Batches of caption (pair) indices holding every caption of ``batch_size`` images, grouped by image (see the
    module docstring). Images in a random order deterministic in ``seed``, each once an epoch. With ``world_size``
    > 1 the order is extended by wrapping round (as torch's DistributedSampler pads) to whole batches, the same
    number for every process, and rank r takes batches r, r + world_size, ..."""

    def __init__(self, caption_image: np.ndarray, batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1) -> None:
        caption_image = np.asarray(caption_image)
        order = np.argsort(caption_image, kind="stable")
        self.images, starts = np.unique(caption_image[order], return_index=True)
        self.captions_of = np.split(order, starts[1:])  # image k's captions, in split order
        if batch_size > len(self.images):
            raise XmrError(f"train.batch_size: {batch_size} images per batch (train.batch_by: image), but the "
                           f"training split has {len(self.images)} images")
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        n = len(self.images)
        per_rank = -(-n // (batch_size * world_size))
        self.num_batches = -(-n // batch_size) if world_size == 1 else per_rank * world_size

    def __len__(self) -> int:
        return len(range(self.rank, self.num_batches, self.world_size))

    def __iter__(self) -> Iterator[list[int]]:
        perm = np.random.default_rng(self.seed).permutation(len(self.images))
        if self.world_size > 1:
            perm = np.resize(perm, self.num_batches * self.batch_size)  # wraps round
        for b in range(self.rank, self.num_batches, self.world_size):
            chosen = perm[b * self.batch_size:(b + 1) * self.batch_size]
            yield [int(j) for k in chosen for j in self.captions_of[k]]


def first_appearances(image_index: list[int]) -> tuple[list[int], list[int]]:
    """(the distinct images of a batch's pairs in the order they first appear, each pair's row among them)."""
    row: dict[int, int] = {}
    rows = [row.setdefault(i, len(row)) for i in image_index]
    return list(row), rows


class ImageIndexedPairs(PairDataset):
    """The pairs of an image-indexed batch with each image read once: ``__getitems__`` gives the batch's distinct
    images (:func:`first_appearances` order) and every pair's caption, for :class:`ImageIndexedCollate`."""

    def __getitems__(self, js: list[int]) -> RegionBatch:
        images = [int(self.data.caption_image[j]) for j in js]
        store_rows = [self.feature_row(i) for i in first_appearances(images)[0]]
        items = [(None, None, *self._text(j), i, j) for i, j in zip(images, js)]
        if isinstance(self.feats, ImageFiles):  # pixels where the features go; the collate renames them
            return RegionBatch(torch.stack([self.feats[r] for r in store_rows]), None, items)
        return RegionBatch(*read_regions(self.feats, store_rows, self.max_regions), items)


class ImageIndexedCollate(PairCollate):
    """:class:`~xmr.inference.loaders.PairCollate`'s batch of an :class:`ImageIndexedPairs` batch: the image side holds
    each image once; ``image_rows`` (one per pair) is the row of the pair's image in it."""

    def __call__(self, items: RegionBatch) -> dict:
        out = super().__call__(items)
        if out["num_regions"] is None:  # image files (end to end)
            out["images"] = out.pop("feats")
            del out["num_regions"]
        out["image_rows"] = torch.tensor(first_appearances(out["image_index"].tolist())[1])
        return out


@dataclass(frozen=True)
class CaptionTexts:
    """Caption texts of a training split as ids: ``caption_text[j]`` the id of caption j's normalised text,
    ``image_texts[i]`` the ids of image i's captions (padded with -1)."""

    caption_text: torch.Tensor
    image_texts: torch.Tensor

    def to(self, device: torch.device | str) -> "CaptionTexts":
        return CaptionTexts(self.caption_text.to(device), self.image_texts.to(device))


def caption_texts(data: CaptionedSplit) -> CaptionTexts:
    """Text ids of a split's captions: equal ids = the same words (lower-cased tokens, whitespace ignored)."""
    ids: dict[str, int] = {}
    words = data.tokens if data.tokens else [c.lower().split() for c in data.captions]
    caption_text = np.array([ids.setdefault(" ".join(w).lower(), len(ids)) for w in words], dtype=np.int64)
    per_image = np.bincount(data.caption_image, minlength=data.num_images)
    image_texts = np.full((data.num_images, max(1, int(per_image.max(initial=0)))), -1, dtype=np.int64)
    fill = np.zeros(data.num_images, dtype=np.int64)
    for j, i in enumerate(data.caption_image):
        image_texts[i, fill[i]] = caption_text[j]
        fill[i] += 1
    return CaptionTexts(torch.from_numpy(caption_text), torch.from_numpy(image_texts))


def positive_mask(image_index: torch.Tensor, labels: torch.Tensor | None, positives: str,
                  mask_same_image: bool, caption_index: torch.Tensor | None = None,
                  texts: CaptionTexts | None = None) -> torch.Tensor:
    """(B, B) bool, rows images and columns captions of the batch's pairs: caption j is a positive for image i
    (the diagonal always is). ``caption_text`` needs the pairs' ``caption_index`` and the split's ``texts``."""
    eye = torch.eye(len(image_index), dtype=torch.bool, device=image_index.device)
    if not mask_same_image:
        return eye
    if positives == "class":
        if labels is None:
            raise XmrError("train.positives: class needs class labels, and this dataset's images have none; "
                           "use train.positives: image")
        return (labels[:, None] == labels[None, :]) | eye
    if positives == "caption_text":
        if texts is None or caption_index is None:
            raise XmrError("train.positives: caption_text needs the batch's caption indices and the split's "
                           "caption texts (xmr.train.samplers.caption_texts)")
        own = texts.image_texts[image_index]  # (B, C): the texts of each row's image
        return (own[:, :, None] == texts.caption_text[caption_index][None, None, :]).any(1) | eye
    return (image_index[:, None] == image_index[None, :]) | eye


def check_batching(batching: Batching, data, name: str, dataset: str) -> None:
    """Fail before training when the batching options do not fit the dataset (errors name the run and dataset)."""
    if batching.batch_by == "image":
        if batching.sampler != "random":
            raise XmrError(f"{name}: train.batch_by: image draws whole images, train.sampler: {batching.sampler} "
                           f"draws pairs; use one of them (train.sampler: random with batch_by: image)")
        if not batching.mask_same_image:
            raise XmrError(f"{name}: train.batch_by: image puts every caption of an image in its batch, and "
                           f"train.mask_same_image: false would make them negatives of their own image; set "
                           f"train.mask_same_image: true")
    needs_labels = batching.sampler == "one_per_class" or batching.positives == "class"
    if needs_labels and data.image_labels is None:
        key = "train.sampler: one_per_class" if batching.sampler == "one_per_class" else "train.positives: class"
        raise XmrError(f"{name}: {key} needs class labels, but the images of {dataset}'s training "
                       f"split have none (CUB has them; synth when generated with labels)")
