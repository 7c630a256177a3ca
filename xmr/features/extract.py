"""``xmr extract``: run a backbone over a split's images and write the feature store (resumable).

Images are decoded and resized (:mod:`xmr.features.decode`) in DataLoader worker processes, or decoded on the
device (``decoder``), and shards are written by a background thread, so decoding and writing overlap the forward
pass. Six resize modes (backbone config ``resize``; default: the
backbone's own, else ``squash``):

- ``squash``: the whole image to ``input_size`` x ``input_size`` (aspect ratio not kept; VSE∞'s grid-feature
  reading: every object a caption may mention stays in view);
- ``squash_inter_linear``: the same square, as VSE∞'s released code resizes at test time (cv2 INTER_LINEAR of the
  float image: no antialiasing, no rounding to uint8), for its imported grid models;
- ``center_crop``: shorter side to ``input_size / 0.875``, then the central ``input_size`` square (the
  ImageNet evaluation transform; PCME's reading for its ResNet features);
- ``torchvision_center_crop``: the same, exactly as torchvision's ``Resize(256)`` + ``CenterCrop(224)`` (long
  side truncated, crop offset rounded half to even): the reference code's transform, for imported checkpoints;
- ``shorter_side_center_crop``: shorter side to ``input_size``, then the central square (CLIP's image processor);
- ``shorter_side``: shorter side to ``input_size``, longer side at most ``max_size``, aspect ratio kept, batch
  zero-padded (detectors: BUTD uses 600 / 1000). Only for backbones that handle padded batches.

Region backbones return boxes in network-input pixels; they are stored in original-image pixels. Backbones
that ``needs_boxes`` get the dataset's per-image boxes (``CaptionedSplit.extra['boxes']``, original pixels),
scaled to the resized input.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from xmr.core.errors import XmrError
from xmr.core.io import check_writable_dir
from xmr.core.utils import resolve_device, tune_cpu_allocator
from xmr.data.base import CaptionedSplit
from xmr.features.backbones import Backbone, build_backbone
from xmr.features.decode import (RESIZE_MODES, EncodedImageDataset, ImageFolderDataset, collate_encoded,
                                 decode_batch, fallback_summary, resolve_decoder)
from xmr.features.store import ShardWriter

#: config keys that do not change the features (a resumed run may differ in them)
_NON_FEATURE_KEYS = {"description", "batch_size", "key", "decoder"}  # the resolved decoder is an attr of its own


def input_settings(backbone_cfg: dict, backbone: Backbone) -> tuple[int, str, int | None]:
    """``(input_size, resize mode, max_size)`` of a backbone: its config, else the backbone's own defaults."""
    own = backbone.input_defaults(backbone_cfg) if hasattr(backbone, "input_defaults") else {}
    # a saved image processor (transformers towers) fixes the size the model was trained at
    size = int(own.get("input_size") or backbone_cfg.get("input_size") or 224)
    resize = backbone_cfg.get("resize") or own.get("resize") or getattr(backbone, "resize", "squash")
    max_size = backbone_cfg.get("max_size") or getattr(backbone, "max_size", None)
    if resize not in RESIZE_MODES:
        raise XmrError(f"backbone {backbone_cfg.get('key', backbone_cfg['name'])}: resize {resize!r}; choose one "
                       f"of {', '.join(RESIZE_MODES)}")
    return size, resize, max_size


def normalise(x: torch.Tensor, mean, std, image_sizes: list[tuple[int, int]] | None = None,
              pixel_scale: float = 255.0) -> torch.Tensor:
    """0-255 pixels (B, 3, H, W), uint8 or float -> float ``(x / pixel_scale - mean) / std``; padding (outside
    ``image_sizes``) stays 0. ``pixel_scale`` is the backbone's (1 for Caffe weights: means in 0-255 units)."""
    m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
    s = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
    out = (x.float() / pixel_scale - m) / s
    if image_sizes is not None:
        for i, (h, w) in enumerate(image_sizes):
            out[i, :, h:, :] = 0
            out[i, :, :, w:] = 0
    return out


def collate_padded(items):
    """Stack same-size images; zero-pad different sizes to the largest (bottom/right)."""
    images = [x for x, _ in items]
    geoms = torch.stack([g for _, g in items])
    if all(x.shape == images[0].shape for x in images):
        return torch.stack(images), geoms
    h = max(x.shape[1] for x in images)
    w = max(x.shape[2] for x in images)
    out = images[0].new_zeros(len(images), 3, h, w)
    for i, x in enumerate(images):
        out[i, :, : x.shape[1], : x.shape[2]] = x
    return out, geoms


def boxes_to_input(boxes: np.ndarray, geom: torch.Tensor) -> torch.Tensor:
    """Original-pixel boxes (K, 4) -> network-input pixels for an image with geometry ``geom``."""
    _, _, sx, sy, left, top = geom.tolist()
    b = torch.as_tensor(np.asarray(boxes, dtype=np.float64).reshape(-1, 4))
    return (b * torch.tensor([sx, sy, sx, sy], dtype=torch.float64)
            - torch.tensor([left, top, left, top], dtype=torch.float64)).float()


def boxes_to_original(boxes: np.ndarray, geom: torch.Tensor) -> np.ndarray:
    """Network-input boxes (K, 4) -> original-image pixels (the inverse of :func:`boxes_to_input`)."""
    _, _, sx, sy, left, top = geom.tolist()
    b = np.asarray(boxes, dtype=np.float64)
    return ((b + [left, top, left, top]) / [sx, sy, sx, sy]).astype(np.float32)


def feature_config(backbone_cfg: dict) -> str:
    """The backbone settings that determine the features, as canonical JSON (stored in the file's attrs)."""
    return json.dumps({k: v for k, v in sorted(backbone_cfg.items()) if k not in _NON_FEATURE_KEYS},
                      sort_keys=True, default=str)


def extract_features(split: CaptionedSplit, backbone_cfg: dict, out: str | os.PathLike, batch_size: int = 32,
                     workers: int = 2, dtype: str = "float32", device: str = "auto", progress: bool | None = True,
                     backbone: Backbone | None = None, threads: int | None = None) -> Path:
    """Extract ``backbone_cfg`` features for every image of ``split`` into ``out`` (HDF5, see store.py).

    Resumable: finished batches are kept as shards next to ``out``; rerunning the same command continues.
    ``progress``: a bar (True), log lines (False: cluster jobs) or nothing (None: the Python API).
    ``backbone``: an already built ``build_backbone(backbone_cfg)`` to reuse (benchmarks, notebooks).
    ``threads``: torch's CPU threads for the backbone (None: torch's default, one per core). Convolutions sum in
    an order that depends on it, so a fixed count gives the same features on any machine of one CPU family.
    ``backbone_cfg['decoder']``: ``pil`` (workers decode), ``device`` (workers read bytes, the device decodes;
    :mod:`xmr.features.decode`) or ``auto`` (device on CUDA).
    """
    import sys
    from collections import Counter

    from xmr.core.progress import bar as progress_bar

    split.require_images("import its features with `xmr import-features` instead of extracting them")
    if dtype not in ("float32", "float16"):
        raise XmrError(f"dtype {dtype!r}: use float32 or float16")
    dev = resolve_device(device)
    check_writable_dir(Path(out).parent, "feature output directory")  # before the backbone loads
    if dev.type == "cpu":
        tune_cpu_allocator()
    if threads:
        torch.set_num_threads(threads)
    decoder = resolve_decoder(backbone_cfg.get("decoder") or "auto", dev)
    backbone = (build_backbone(backbone_cfg) if backbone is None else backbone).to(dev).for_extraction()
    if backbone.channels_last:
        backbone = backbone.to(memory_format=torch.channels_last)
    size, resize, max_size = input_settings(backbone_cfg, backbone)
    padded = resize == "shorter_side"
    if padded and not getattr(backbone, "supports_keep_aspect", False):
        raise XmrError(f"backbone {backbone_cfg['name']}: resize shorter_side needs a region backbone "
                       f"(grid features of padded batches would mix in padding); use squash or center_crop")
    needs_boxes = bool(getattr(backbone, "needs_boxes", False))
    given_boxes = split.extra.get("boxes") if needs_boxes else None
    if needs_boxes:
        if given_boxes is None or len(given_boxes) != split.num_images:
            raise XmrError(f"dataset {split.name} split {split.split}: backbone {backbone_cfg['name']} needs "
                           f"per-image boxes, but the dataset has none (Karpathy JSON `objects[].box`); use "
                           f"`boxes: detector` instead")
        if resize in ("center_crop", "torchvision_center_crop", "shorter_side_center_crop"):
            raise XmrError(f"backbone {backbone_cfg['name']}: given boxes need resize squash or shorter_side "
                           f"(a center crop cuts boxes off)")
    writer = ShardWriter(out, split.num_images, {
        "backbone": backbone_cfg["name"], "backbone_key": backbone_cfg.get("key"),
        "weights_sha256": backbone.weights_sha256, "input_size": size, "resize": resize,
        "dataset": split.name, "split": split.split, "batch_size": batch_size, "dtype": dtype,
        "backbone_config": feature_config(backbone_cfg), "decoder": decoder,
    })
    if decoder == "device":
        ds = EncodedImageDataset(split.image_paths, size, resize, max_size)
    else:
        ds = ImageFolderDataset(split.image_paths, size, resize, max_size)
    starts = [s for s in range(0, len(ds), batch_size) if not writer.done(s)]
    todo = torch.utils.data.Subset(ds, [i for s in starts for i in range(s, min(s + batch_size, len(ds)))])
    loader = DataLoader(todo, batch_size=batch_size, shuffle=False, num_workers=workers,
                        collate_fn=collate_encoded if decoder == "device" else collate_padded,
                        pin_memory=dev.type == "cuda", persistent_workers=False)
    reasons: Counter = Counter()

    def to_device(start: int, batch):
        """A loader batch -> (uint8 (B, 3, H, W) on ``dev``, geometries on the CPU)."""
        if decoder == "pil":
            x, geoms = batch
            return x.to(dev, non_blocking=True), geoms
        paths = split.image_paths[start: start + len(batch)]
        return collate_padded(decode_batch(batch, paths, dev, size, resize, max_size, reasons))

    np_dtype = np.float16 if dtype == "float16" else np.float32
    # without a bar: a line every 100 batches and the throughput at the end (logs of cluster jobs)
    bar = progress_bar(total=len(ds), initial=len(ds) - len(todo), desc=f"extract {split.name}/{split.split}",
                       unit="img", progress=progress, every=100)
    try:
        _run(backbone, loader, starts, to_device, writer, dev, np_dtype, given_boxes, padded, bar)
    except XmrError as e:
        writer.abandon()  # finished shards stay for the rerun; a lone settings stamp does not
        raise XmrError(_worker_message(str(e))) from None
    except BaseException:
        writer.abandon()
        raise
    bar.close()
    if reasons:
        print(fallback_summary(reasons, len(todo)), file=sys.stderr)
    return writer.finish(split.image_ids, dtype=dtype)


def _worker_message(msg: str) -> str:
    """An XmrError raised in a DataLoader worker arrives wrapped with its traceback: keep its one line."""
    if "Original Traceback" in msg:
        return msg.strip().splitlines()[-1].split("XmrError: ", 1)[-1]
    return msg


def _run(backbone, loader, starts, to_device, writer, dev, np_dtype, given_boxes, padded, bar) -> None:
    """The extraction loop: forward each batch, hand its shard to the writer thread (at most two queued).
    ``to_device(start, batch) -> (uint8 images on dev, geometries)``; ``given_boxes``: per-image original-pixel
    boxes for backbones that need them, else None."""
    pending: list[Future] = []
    with ThreadPoolExecutor(max_workers=1) as pool, torch.inference_mode():
        for start, batch in zip(starts, loader):
            x, geoms = to_device(start, batch)
            kwargs = {}
            if given_boxes is not None:
                kwargs["boxes"] = [boxes_to_input(given_boxes[start + i], g).to(dev) for i, g in enumerate(geoms)]
            if padded:
                kwargs["image_sizes"] = [(round(g[3].item() * g[1].item()), round(g[2].item() * g[0].item()))
                                         for g in geoms]
            x = normalise(x, backbone.mean, backbone.std, kwargs.get("image_sizes"), backbone.pixel_scale)
            if backbone.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            result = backbone(x, **kwargs)
            feats, boxes = result[0], result[1]
            nreg = (result[2].cpu().numpy() if len(result) > 2
                    else np.full(len(feats), feats.shape[1], dtype=np.int32))
            f = feats.float().cpu().numpy().astype(np_dtype)
            b = None
            if boxes is not None:
                b = boxes.float().cpu().numpy()
                b = np.stack([boxes_to_original(b[i], g) for i, g in enumerate(geoms)])
                for i, n in enumerate(nreg):  # padding rows stay zero in original pixels too
                    b[i, n:] = 0
            wh = geoms[:, :2].round().int().numpy()
            while len(pending) >= 2:  # bounded queue: at most two batches wait for the disk
                pending.pop(0).result()
            pending.append(pool.submit(writer.write, start, f, nreg, b, None, wh))
            bar.update(len(f))
        for fut in pending:
            fut.result()
