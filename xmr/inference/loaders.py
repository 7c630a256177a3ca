"""Datasets over (image side, captions) for training and encoding.

The image side is either precomputed features (:class:`FeatureFile`; batches carry ``feats`` (B, R, F) and
``num_regions``) or, for end-to-end training (``features.source: images``), the split's image files
(:class:`ImageFiles`; batches carry uint8 ``images`` (B, 3, H, W) for the model's backbone). :func:`image_input`
gives either as the ``(image_input, num_regions)`` pair the model takes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from xmr.core.errors import XmrError
from xmr.data.base import CaptionedSplit, load_split
from xmr.features.decode import read_image
from xmr.features.store import FeatureFile
from xmr.settings.run_settings import ImageInput


def load_split_with_features(image: ImageInput, dataset_cfg: dict, split: str) -> tuple[CaptionedSplit, FeatureFile]:
    data = load_split(dataset_cfg, split)
    feats = FeatureFile(image.feature_path(split))
    if feats.image_ids != data.image_ids:
        raise XmrError(f"{feats.path}: image ids do not match split {split!r} of {image.dataset} "
                       f"({len(feats.image_ids)} vs {data.num_images} images); re-extract the features")
    return data, feats


class TrainAugment:
    """VSE∞'s training-time image augmentation (``RawImageDataset._process_image``), on the original image before
    the shared resize: a crop of a U(low, high) fraction of each side at a uniform position, and a horizontal flip
    with probability ``hflip``. Draws from torch's RNG, which the trainer reseeds every epoch (and DataLoader
    seeds per worker), so runs repeat exactly."""

    def __init__(self, crop_scale: list[float] | None = None, hflip: float = 0.0) -> None:
        self.crop_scale, self.hflip = crop_scale, hflip

    def __call__(self, im):
        from PIL import Image

        if self.crop_scale is not None:
            lo, hi = self.crop_scale
            r = lo + (hi - lo) * torch.rand(()).item()
            w, h = im.size
            cw, ch = max(1, int(w * r)), max(1, int(h * r))
            left = int(torch.randint(0, w - cw + 1, ()).item())
            top = int(torch.randint(0, h - ch + 1, ()).item())
            im = im.crop((left, top, left + cw, top + ch))
        if self.hflip and torch.rand(()).item() < self.hflip:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        return im


class ImageFiles(Dataset):
    """A split's image files as uint8 network inputs (B, 3, H, W), prepared by ``xmr extract``'s
    :func:`~xmr.features.decode.read_image` (same size, resize mode), plus ``augment`` in training."""

    def __init__(self, paths: list[Path], size: int, resize: str = "squash", max_size: int | None = None,
                 augment: TrainAugment | None = None) -> None:
        self.paths, self.size, self.resize, self.max_size, self.augment = paths, size, resize, max_size, augment

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return read_image(self.paths[i], self.size, self.resize, self.max_size, self.augment)[0]


def load_split_with_images(image: ImageInput, dataset_cfg: dict, split: str,
                           train: bool = False) -> tuple[CaptionedSplit, ImageFiles]:
    """A split and its image files for end-to-end training; ``train`` adds the configured augmentation."""
    data = load_split(dataset_cfg, split)
    data.require_images("features.source: images needs the images, use features.source: precomputed")
    augment = TrainAugment(image.crop_scale, image.hflip) if train and (image.crop_scale or image.hflip) else None
    prep = image.preparation
    return data, ImageFiles(data.image_paths, prep.size, prep.resize, prep.max_size, augment)


def load_split_images(image: ImageInput, dataset_cfg: dict, split: str,
                      train: bool = False) -> tuple[CaptionedSplit, FeatureFile | ImageFiles]:
    """The split with its image side: features (``features.source: precomputed``) or image files (``images``);
    ``dataset_cfg``: the dataset's own config."""
    if image.end_to_end:
        return load_split_with_images(image, dataset_cfg, split, train)
    return load_split_with_features(image, dataset_cfg, split)


def image_input(batch: dict, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(image_input, num_regions)`` of a batch, moved to ``device`` when given: padded features and counts,
    or pixels and None. Features stored as float16 travel as float16 (half the bytes through the loader and the
    host-to-device copy) and become float32 here, after the copy: on the GPU when training there."""
    if "images" in batch:
        x, n = batch["images"], None
    else:
        x, n = batch["feats"], batch["num_regions"]
    if device is not None:
        x = x.to(device, non_blocking=True)
        n = None if n is None else n.to(device, non_blocking=True)
    if n is not None and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return x, n


def _image_item(feats: FeatureFile, i: int, max_regions: int | None) -> tuple[torch.Tensor, int]:
    x = feats[i]
    n = int(feats.num_regions[i])
    if max_regions is not None and n > max_regions:
        n = max_regions
    return torch.from_numpy(np.asarray(x[:n], dtype=np.float32)), n


def _stack_regions(items: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    r = max(n for _, n in items)
    out = torch.zeros(len(items), r, items[0][0].shape[-1])
    for i, (x, n) in enumerate(items):
        out[i, :n] = x[:n]
    return out, torch.tensor([n for _, n in items])


def read_regions(feats: FeatureFile, indices: list[int], max_regions: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded (B, r, F) features (zeros past each image's count) and (B,) region counts of the images
    ``indices``, r the batch's largest count: the same values as stacking :func:`_image_item` per image, in one
    store read. A float16 store stays float16 (:func:`image_input` converts after the copy to the device): the
    per-image reads and the float32 conversion capped the loader at about 2,000 samples/s (docs/speed.md)."""
    idx = np.asarray(indices, dtype=np.int64)
    n = feats.num_regions[idx].astype(np.int64)
    if max_regions is not None:
        n = np.minimum(n, max_regions)
    r = int(n.max())
    rows = feats.rows(idx, r)
    out = torch.from_numpy(rows if rows.dtype == np.float16 else np.asarray(rows, dtype=np.float32))
    counts = torch.from_numpy(n)
    pad = torch.arange(r)[None, :] >= counts[:, None]
    if bool(pad.any()):
        out[pad] = 0.0
    return out, counts


class RegionBatch:
    """What the batched ``__getitems__`` of a dataset over a :class:`FeatureFile` hands its collate: the batch's
    features read at once, and the per-item rest (``items``: tuples whose image slots are None)."""

    def __init__(self, feats: torch.Tensor, num_regions: torch.Tensor, items: list[tuple]) -> None:
        self.feats, self.num_regions, self.items = feats, num_regions, items


class PairDataset(Dataset):
    """One item per caption: (image side, caption, image index). An epoch visits every caption once.
    ``feats``: precomputed features, or :class:`ImageFiles` (end to end; the region count is then None).
    A DataLoader fetches whole batches through ``__getitems__`` (one store read per batch)."""

    def __init__(self, data: CaptionedSplit, feats: FeatureFile | ImageFiles, max_regions: int | None = None) -> None:
        self.data, self.feats, self.max_regions = data, feats, max_regions

    def __len__(self) -> int:
        return self.data.num_captions

    def feature_row(self, i: int) -> int:
        """The store row (or image file) read for image ``i``: ``i`` (a hook for the benchmark's sanity tests)."""
        return i

    def _text(self, j: int) -> tuple:
        return self.data.captions[j], self.data.tokens[j] if self.data.tokens else []

    def __getitem__(self, j: int):
        i = int(self.data.caption_image[j])
        if isinstance(self.feats, ImageFiles):
            x, n = self.feats[self.feature_row(i)], None
        else:
            x, n = _image_item(self.feats, self.feature_row(i), self.max_regions)
        return x, n, *self._text(j), i, j

    def __getitems__(self, js: list[int]):
        if isinstance(self.feats, ImageFiles):
            return [self[j] for j in js]
        images = [int(self.data.caption_image[j]) for j in js]
        feats, counts = read_regions(self.feats, [self.feature_row(i) for i in images], self.max_regions)
        return RegionBatch(feats, counts, [(None, None, *self._text(j), i, j) for i, j in zip(images, js)])


class PairCollate:
    """``text_collate(captions, tokens, caption_indices, split)`` is the text encoder's collate."""

    def __init__(self, text_collate, split: str) -> None:
        self.text_collate, self.split = text_collate, split

    def __call__(self, items):
        if isinstance(items, RegionBatch):
            image = {"feats": items.feats, "num_regions": items.num_regions}
            items = items.items
        elif items[0][1] is None:  # image files (end to end)
            image = {"images": torch.stack([x for x, *_ in items])}
        else:
            feats, lengths = _stack_regions([(x, n) for x, n, *_ in items])
            image = {"feats": feats, "num_regions": lengths}
        text = self.text_collate([it[2] for it in items], [it[3] for it in items], [it[5] for it in items],
                                 self.split)
        return {**image, "text": text, "image_index": torch.tensor([it[4] for it in items]),
                "caption_index": torch.tensor([it[5] for it in items])}


class ImageDataset(Dataset):
    def __init__(self, feats: FeatureFile, indices: list[int], max_regions: int | None = None) -> None:
        self.feats, self.indices, self.max_regions = feats, indices, max_regions

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        return _image_item(self.feats, self.indices[k], self.max_regions)

    def __getitems__(self, ks: list[int]) -> RegionBatch:
        feats, counts = read_regions(self.feats, [self.indices[k] for k in ks], self.max_regions)
        return RegionBatch(feats, counts, [])


def collate_images(items):
    if isinstance(items, RegionBatch):
        return {"feats": items.feats, "num_regions": items.num_regions}
    feats, lengths = _stack_regions(items)
    return {"feats": feats, "num_regions": lengths}


def collate_image_files(items: list[torch.Tensor]) -> dict:
    return {"images": torch.stack(items)}


def image_loader_parts(images: FeatureFile | ImageFiles, indices: list[int], max_regions: int | None = None):
    """(Dataset, collate_fn) over the images ``indices`` of a split's image side, for encoding."""
    if isinstance(images, ImageFiles):
        return torch.utils.data.Subset(images, indices), collate_image_files
    return ImageDataset(images, indices, max_regions), collate_images


class CaptionDataset(Dataset):
    def __init__(self, data: CaptionedSplit, indices: list[int]) -> None:
        self.data, self.indices = data, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        j = self.indices[k]
        return self.data.captions[j], self.data.tokens[j] if self.data.tokens else [], j


class CaptionCollate:
    def __init__(self, text_collate, split: str) -> None:
        self.text_collate, self.split = text_collate, split

    def __call__(self, items):
        return {"text": self.text_collate([c for c, _, _ in items], [t for _, t, _ in items],
                                          [j for _, _, j in items], self.split)}
