"""Datasets over (precomputed image features, captions) for training and encoding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from xmr.data.base import CaptionedSplit, load_split
from xmr.errors import XmrError
from xmr.features.store import FeatureFile


def feature_path(cfg: dict, split: str) -> Path:
    """``{features.dir}/{dataset}/{backbone}/{split}.h5``: shared by every method using that backbone."""
    return Path(cfg["features"]["dir"]) / cfg["dataset"] / cfg["features"]["backbone"] / f"{split}.h5"


def load_split_with_features(cfg: dict, split: str) -> tuple[CaptionedSplit, FeatureFile]:
    data = load_split(cfg["dataset_cfg"], split)
    feats = FeatureFile(feature_path(cfg, split))
    if feats.image_ids != data.image_ids:
        raise XmrError(f"{feats.path}: image ids do not match split {split!r} of {cfg['dataset']} "
                       f"({len(feats.image_ids)} vs {data.num_images} images); re-extract the features")
    return data, feats


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


class PairDataset(Dataset):
    """One item per caption: (image features, caption, image index). An epoch visits every caption once."""

    def __init__(self, data: CaptionedSplit, feats: FeatureFile, max_regions: int | None = None) -> None:
        self.data, self.feats, self.max_regions = data, feats, max_regions

    def __len__(self) -> int:
        return self.data.num_captions

    def __getitem__(self, j: int):
        i = int(self.data.caption_image[j])
        x, n = _image_item(self.feats, i, self.max_regions)
        return x, n, self.data.captions[j], self.data.tokens[j] if self.data.tokens else [], i, j


class PairCollate:
    """``text_collate(captions, tokens, caption_indices, split)`` is the text encoder's collate."""

    def __init__(self, text_collate, split: str) -> None:
        self.text_collate, self.split = text_collate, split

    def __call__(self, items):
        feats, lengths = _stack_regions([(x, n) for x, n, *_ in items])
        text = self.text_collate([it[2] for it in items], [it[3] for it in items], [it[5] for it in items],
                                 self.split)
        return {"feats": feats, "num_regions": lengths, "text": text,
                "image_index": torch.tensor([it[4] for it in items])}


class ImageDataset(Dataset):
    def __init__(self, feats: FeatureFile, indices: list[int], max_regions: int | None = None) -> None:
        self.feats, self.indices, self.max_regions = feats, indices, max_regions

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        return _image_item(self.feats, self.indices[k], self.max_regions)


def collate_images(items):
    feats, lengths = _stack_regions(items)
    return {"feats": feats, "num_regions": lengths}


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
