"""``xmr extract``: run a backbone over a split's images and write the feature store (resumable)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from xmr.data.base import CaptionedSplit
from xmr.errors import XmrError
from xmr.features.backbones import Backbone, build_backbone
from xmr.features.store import ShardWriter
from xmr.utils import resolve_device


class ImageFolderDataset(Dataset):
    """Decodes and resizes images in worker processes so that decoding overlaps the forward pass."""

    def __init__(self, paths: list[Path], size: int, mean, std) -> None:
        self.paths, self.size = paths, size
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        from PIL import Image

        p = self.paths[i]
        try:
            with Image.open(p) as im:
                w, h = im.size
                im = im.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
                x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float() / 255.0
        except (OSError, ValueError) as e:
            raise XmrError(f"{p}: cannot read image ({e})") from None
        return (x - self.mean) / self.std, torch.tensor([w, h], dtype=torch.float32)


def extract_features(split: CaptionedSplit, backbone_cfg: dict, out: str | os.PathLike, batch_size: int = 32,
                     workers: int = 2, dtype: str = "float32", device: str = "auto", progress: bool = True) -> Path:
    """Extract ``backbone_cfg`` features for every image of ``split`` into ``out`` (HDF5, see store.py)."""
    from tqdm import tqdm

    missing = [p for p in split.image_paths if not Path(p).exists()]
    if missing:
        raise XmrError(f"{missing[0]}: image not found ({len(missing)} of {split.num_images} missing); "
                       f"check the dataset's `images:` folder")
    dev = resolve_device(device)
    backbone: Backbone = build_backbone(backbone_cfg).to(dev)
    size = int(backbone_cfg.get("input_size", 224))
    writer = ShardWriter(out, split.num_images, {
        "backbone": backbone_cfg["name"], "weights_sha256": backbone.weights_sha256, "input_size": size,
        "dataset": split.name, "split": split.split, "batch_size": batch_size,
    })
    ds = ImageFolderDataset(split.image_paths, size, backbone.mean, backbone.std)
    starts = [s for s in range(0, len(ds), batch_size) if not writer.done(s)]
    todo = torch.utils.data.Subset(ds, [i for s in starts for i in range(s, min(s + batch_size, len(ds)))])
    loader = DataLoader(todo, batch_size=batch_size, shuffle=False, num_workers=workers,
                        pin_memory=dev.type == "cuda", persistent_workers=False)
    np_dtype = np.float16 if dtype == "float16" else np.float32
    bar = tqdm(total=len(ds), initial=len(ds) - len(todo), desc=f"extract {split.name}/{split.split}",
               unit="img", disable=not progress)
    with torch.inference_mode():
        for start, (x, _sizes) in zip(starts, loader):
            feats, boxes = backbone(x.to(dev, non_blocking=True))
            f = feats.float().cpu().numpy().astype(np_dtype)
            writer.write(start, f, np.full(len(f), f.shape[1]), None if boxes is None else boxes.cpu().numpy())
            bar.update(len(f))
    bar.close()
    return writer.finish(split.image_ids, dtype=dtype)
