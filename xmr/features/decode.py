"""Image decoding and preprocessing: the one resize (:func:`resize_geometry`, :func:`resize_image`,
:func:`read_image`; shared by extraction and end-to-end training), and the two decoders of extraction: PIL in the
DataLoader workers, or JPEG bytes decoded in batches on the device.

On a GPU node, PIL decoding in the workers caps extraction at a few hundred images/s (docs/speed.md) while
the backbone runs thousands. With ``decoder: device`` the workers only read the file's bytes and check its
header; the main process decodes the batch with ``torchvision.io.decode_jpeg(..., device=...)`` (nvJPEG on
CUDA) and resizes it there. Files the device decoder may reject go through PIL in the worker instead
(:func:`device_fallback_reason`), so the result of a batch never depends on nvJPEG's edge cases. ``auto`` picks
``device`` on CUDA and ``pil`` elsewhere: the CPU path keeps the worker-side decoding it had.

The device path's resize (bilinear with antialiasing, :func:`resize_tensor`) follows PIL's BILINEAR resize to
within one grey level, but not bit for bit: the decoder is recorded in the feature store's attributes, and a
partial extraction is never resumed with the other one.
"""

from __future__ import annotations

import os
import struct
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from xmr.core.errors import XmrError

DECODERS = ("auto", "pil", "device")
RESIZE_MODES = ("squash", "center_crop", "torchvision_center_crop", "shorter_side", "squash_inter_linear",
                "shorter_side_center_crop")
#: resize modes whose network input is float32 (not rounded to uint8 after resizing)
FLOAT_RESIZE_MODES = ("squash_inter_linear",)
CROP_RATIO = 0.875  # 224 / 256, the ImageNet evaluation crop


def resize_geometry(w: int, h: int, size: int, mode: str, max_size: int | None = None):
    """How an original ``w`` x ``h`` image maps to the network input.

    Returns ``(new_w, new_h)`` (size after resizing, before cropping), ``(left, top)`` crop offset and the
    input size ``(in_w, in_h)``. A point (x, y) of the original lands at ``(x * new_w / w - left, ...)``.
    """
    if mode in ("squash", "squash_inter_linear"):
        return (size, size), (0, 0), (size, size)
    if mode in ("center_crop", "shorter_side_center_crop"):
        # shorter_side_center_crop: the full shorter side (CLIP's processor: resize 224, crop 224)
        short = round(size / CROP_RATIO) if mode == "center_crop" else size
        r = short / min(w, h)
        nw, nh = max(size, round(w * r)), max(size, round(h * r))
        left, top = (nw - size) // 2, (nh - size) // 2
        return (nw, nh), (left, top), (size, size)
    if mode == "torchvision_center_crop":
        # torchvision's Resize(short) + CenterCrop(size), the reference codes' test transform (PVSE, PCME, VSE++):
        # the long side is truncated, not rounded, and the crop offset is rounded half to even
        short = round(size / CROP_RATIO)
        nw, nh = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
        left, top = int(round((nw - size) / 2.0)), int(round((nh - size) / 2.0))
        return (nw, nh), (left, top), (size, size)
    if mode == "shorter_side":
        r = size / min(w, h)
        if max_size and r * max(w, h) > max_size:
            r = max_size / max(w, h)
        nw, nh = max(1, round(w * r)), max(1, round(h * r))
        return (nw, nh), (0, 0), (nw, nh)
    raise XmrError(f"backbone resize: {mode!r}; choose one of {', '.join(RESIZE_MODES)}")


def resize_image(im, size: int, resize: str = "squash", max_size: int | None = None):
    """A PIL image -> ``(uint8 (3, H, W) network input, geometry)``: the one image preprocessing, shared by
    extraction and end-to-end training (:mod:`xmr.models.image_backbone`). ``squash_inter_linear`` gives a float32
    input (:func:`resize_tensor`). Geometry = ``[w, h, sx, sy, left, top]``:
    original size, scale factors and crop offset (input = original * scale - offset)."""
    from PIL import Image

    w, h = im.size
    (nw, nh), (left, top), (iw, ih) = resize_geometry(w, h, size, resize, max_size)
    if resize in FLOAT_RESIZE_MODES:
        x = torch.from_numpy(np.asarray(im if im.mode == "RGB" else im.convert("RGB"), dtype=np.uint8).copy())
        return resize_tensor(x.permute(2, 0, 1), size, resize, max_size)
    im = (im if im.mode == "RGB" else im.convert("RGB")).resize((nw, nh), Image.BILINEAR)
    if (nw, nh) != (iw, ih):
        im = im.crop((left, top, left + iw, top + ih))
    x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1)
    return x, torch.tensor([w, h, nw / w, nh / h, left, top], dtype=torch.float64)


def read_image(path: str | os.PathLike, size: int, resize: str = "squash", max_size: int | None = None,
               augment=None):
    """Decode ``path`` and :func:`resize_image` it; ``augment(PIL image) -> PIL image`` runs first (training-time
    crops/flips of end-to-end training; the geometry is then relative to the augmented image)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            if augment is not None:
                im = augment(im)
            return resize_image(im, size, resize, max_size)
    except (OSError, ValueError) as e:
        raise XmrError(f"{path}: cannot read image ({e})") from None

# SOF markers: 0xC0 baseline, 0xC1 extended sequential, 0xC2 progressive, 0xC3 lossless; 0xC5-0xC7 hierarchical;
# 0xC9-0xCB and 0xCD-0xCF arithmetic coding.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: markers without a length field


@contextmanager
def _quiet_torchvision_io():
    """torchvision 0.29 warns on every decode that torchcodec will take over image decoding; the pinned
    release still has it (docs/speed.md notes the move)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of TorchVision",
                                category=DeprecationWarning)
        yield


def resolve_decoder(name: str, device: torch.device) -> str:
    """``auto`` -> ``device`` on CUDA, ``pil`` elsewhere; ``pil`` and ``device`` as given."""
    if name not in DECODERS:
        raise XmrError(f"backbone decoder: {name!r}; choose one of {', '.join(DECODERS)}")
    if name == "auto":
        return "device" if device.type == "cuda" else "pil"
    return name


def device_fallback_reason(data: bytes) -> str | None:
    """None when the batched device decoder takes this file; else why it goes to PIL instead.

    The rules (conservative: nvJPEG's batched decoder handles 8-bit Huffman baseline JPEGs with one or three
    components; the rest is an edge case worth a CPU decode): not a JPEG; a malformed header; lossless,
    hierarchical or arithmetic-coded frames; progressive frames; precision other than 8 bits; components
    other than 1 or 3 (CMYK/YCCK); no end-of-image marker (a truncated file: PIL then gives the clear error).
    """
    if data[:2] != b"\xff\xd8":
        return "not a JPEG"
    pos, n = 2, len(data)
    frame = None
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return "malformed JPEG header"
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2: pos + 4])
        if length < 2:
            return "malformed JPEG header"
        if marker in _SOF:
            if pos + 10 > n:
                return "truncated"
            precision, components = data[pos + 4], data[pos + 9]
            frame = (marker, precision, components)
        if marker == 0xDA:  # start of scan: the header is over
            break
        pos += 2 + length
    else:
        return "truncated"
    if frame is None:
        return "malformed JPEG header (no frame)"
    marker, precision, components = frame
    if marker == 0xC3:
        return "lossless JPEG"
    if marker in (0xC5, 0xC6, 0xC7):
        return "hierarchical JPEG"
    if marker >= 0xC9:
        return "arithmetic-coded JPEG"
    if marker == 0xC2:
        return "progressive JPEG"
    if precision != 8:
        return f"{precision}-bit JPEG"
    if components not in (1, 3):
        return f"{components} components (CMYK/YCCK)" if components == 4 else f"{components} components"
    if data.rfind(b"\xff\xd9", pos) < 0:
        return "truncated"
    return None


class ImageFolderDataset(Dataset):
    """The ``pil`` decoder: images decoded and resized in worker processes, so that decoding overlaps the forward
    pass. Items are ``(image (3, H, W) uint8, geometry)`` (:func:`resize_image`). Images stay uint8 until they are
    on the compute device (``normalise`` in xmr/features/extract.py): a quarter of the bytes through worker IPC
    and host-to-GPU copies.
    """

    def __init__(self, paths: list[Path], size: int, resize: str = "squash", max_size: int | None = None) -> None:
        self.paths, self.size, self.resize, self.max_size = paths, size, resize, max_size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        return read_image(self.paths[i], self.size, self.resize, self.max_size)


class EncodedImageDataset(ImageFolderDataset):
    """The ``device`` decoder's items: ``("bytes", uint8 1-D tensor, None)`` for files it takes, else the PIL
    path's ``("pixels", (image, geometry), reason)`` decoded and resized in the worker."""

    def __getitem__(self, i: int):
        path = self.paths[i]
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise XmrError(f"{path}: cannot read image ({e.strerror or e})") from None
        reason = device_fallback_reason(data)
        if reason is None:
            return "bytes", torch.frombuffer(bytearray(data), dtype=torch.uint8), None
        return "pixels", super().__getitem__(i), reason


def collate_encoded(items):
    """Keep the batch as a list: the device decoder takes variable-length byte tensors."""
    return list(items)


def resize_tensor(x: torch.Tensor, size: int, resize: str = "squash", max_size: int | None = None):
    """A decoded uint8 ``(3, h, w)`` tensor (on any device) -> ``(uint8 network input, geometry)``, as
    :func:`resize_image` does for a PIL image (bilinear with antialiasing: PIL's filter).

    ``squash_inter_linear`` is VSE∞'s test transform (``RawImageDataset._process_image``): ``cv2.resize(...,
    interpolation=cv2.INTER_LINEAR)`` of the float32 image to exactly size x size. That is bilinear with half-pixel
    centres (``align_corners=False``), edge-clamped, without antialiasing, also when shrinking; the result stays
    float32 (tests/test_checkpoint_vse_infty_grid.py compares it with cv2's output)."""
    h, w = x.shape[-2:]
    (nw, nh), (left, top), (iw, ih) = resize_geometry(w, h, size, resize, max_size)
    if resize in FLOAT_RESIZE_MODES:
        y = torch.nn.functional.interpolate(x[None].float(), size=(nh, nw), mode="bilinear", antialias=False,
                                            align_corners=False)[0]
        return y, torch.tensor([w, h, nw / w, nh / h, left, top], dtype=torch.float64)
    if (nw, nh) != (w, h):
        y = torch.nn.functional.interpolate(x[None].float(), size=(nh, nw), mode="bilinear", antialias=True,
                                            align_corners=False)
        x = y[0].round_().clamp_(0, 255).to(torch.uint8)
    x = x[:, top: top + ih, left: left + iw]
    return x, torch.tensor([w, h, nw / w, nh / h, left, top], dtype=torch.float64)


def decode_batch(items, paths: list[Path], device: torch.device, size: int, resize: str = "squash",
                 max_size: int | None = None, reasons: Counter | None = None):
    """A batch of :class:`EncodedImageDataset` items -> ``[(uint8 (3, H, W) on device, geometry)]`` in order.

    The byte items are decoded in one call on ``device``; if that call fails, each is decoded alone, and one
    the device decoder still rejects goes through PIL (which names the file when it cannot read it either).
    ``paths``: the items' files (errors and fallbacks). ``reasons`` counts the files that went to PIL, by reason.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    out: list = [None] * len(items)
    todo = [i for i, (kind, _, _) in enumerate(items) if kind == "bytes"]
    for i, (kind, value, reason) in enumerate(items):
        if kind == "pixels":
            x, g = value
            out[i] = (x.to(device, non_blocking=True), g)
            if reasons is not None:
                reasons[reason] += 1
    decoded: dict[int, torch.Tensor] = {}
    if todo:
        with _quiet_torchvision_io():
            try:
                decoded = dict(zip(todo, decode_jpeg([items[i][1] for i in todo], mode=ImageReadMode.RGB,
                                                     device=device)))
            except RuntimeError:  # one bad file fails the whole call: find it
                for i in todo:
                    try:
                        decoded[i] = decode_jpeg(items[i][1], mode=ImageReadMode.RGB, device=device)
                    except RuntimeError:
                        x, g = read_image(paths[i], size, resize, max_size)
                        out[i] = (x.to(device, non_blocking=True), g)
                        if reasons is not None:
                            reasons["rejected by the device decoder"] += 1
    for i, x in decoded.items():
        if x.shape[0] == 1:
            x = x.expand(3, -1, -1)
        out[i] = resize_tensor(x, size, resize, max_size)
    return out


def fallback_summary(reasons: Counter, total: int) -> str:
    """One line: how many of ``total`` images went through PIL, and why (empty when none did)."""
    n = sum(reasons.values())
    if not n:
        return ""
    why = ", ".join(f"{k}: {v}" for k, v in reasons.most_common())
    return f"decoder: {n} of {total} images decoded with PIL instead of on the device ({why})"

