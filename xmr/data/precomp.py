"""Reader for the SCAN / VSE∞ precomputed layout, for training without images.

One folder (config ``root``, e.g. ``data/coco_precomp`` from SCAN's ``data.zip``) holds, per source split
(``train``, ``dev``, ``test``, and for COCO ``testall`` = the 5K test; COCO ``test`` is only its first 1K)::

    {split}_ims.npy    (N, 36, 2048) float32   BUTD region features, one row per image
    {split}_caps.txt   one caption per line, 5 consecutive lines per image
    {split}_ids.txt    optional: image ids (COCO ids; Flickr30K Karpathy ``imgid``), one per image or
                       one per caption (then repeated 5 times)

Images per caption follow SCAN's ``im_div`` rule: when the file has as many image rows as captions, every
caption has its own row (im_div 1); otherwise caption j belongs to image j // (captions / images). xmr needs
``captions_per_image`` captions per image row, so im_div must equal it.

Image ids are the ``_ids.txt`` ids, or the row numbers ``0..N-1`` when there is no ids file; ``xmr
import-features --format scan`` gives the feature file the same ids, so the two always match. Map xmr's
splits to the source splits with ``splits:`` (``{train: [train], val: [dev], test: [testall]}`` for COCO 5K).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xmr.data.base import DATASET_READERS, CaptionedSplit
from xmr.data.karpathy import tokenize
from xmr.errors import XmrError


@dataclass
class PrecompFiles:
    """The files of one source split of a SCAN precomputed folder, checked for consistency."""

    ims_path: Path
    caps_path: Path
    ids_path: Path | None
    captions: list[str]
    image_ids: list[str]
    num_images: int
    im_div: int
    shape: tuple[int, ...]


def read_lines(path: Path, what: str) -> list[str]:
    """Non-final lines of a text file, stripped; an empty line (other than trailing ones) is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise XmrError(f"{path}: not UTF-8 text (byte {e.start})") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            raise XmrError(f"{path}:{lineno}: empty line; the file must hold one {what} per line")
    return [ln.strip() for ln in lines]


def read_precomp_files(src_dir: str | Path, split: str, need_features: bool = True) -> PrecompFiles:
    src = Path(src_dir)
    ims, caps_path, ids_path = src / f"{split}_ims.npy", src / f"{split}_caps.txt", src / f"{split}_ids.txt"
    if not caps_path.exists():
        avail = sorted(p.name[: -len("_caps.txt")] for p in src.glob("*_caps.txt")) if src.is_dir() else []
        raise XmrError(f"{caps_path}: not found (SCAN precomputed layout; splits here: {avail or 'none'}; COCO "
                       f"uses train/dev/test/testall, Flickr30K train/dev/test)")
    if ims.exists():
        try:
            arr = np.load(ims, mmap_mode="r")
        except ValueError as e:
            raise XmrError(f"{ims}: not a .npy array ({e})") from None
        shape = tuple(arr.shape)
        if arr.ndim not in (2, 3) or not np.issubdtype(arr.dtype, np.floating):
            raise XmrError(f"{ims}: expected float features (N, R, F) or (N, F), got {arr.dtype} {shape}")
    elif need_features:
        raise XmrError(f"{ims}: not found; the SCAN download holds {split}_ims.npy next to {caps_path.name}")
    else:
        shape = ()
    captions = read_lines(caps_path, "caption")
    ids = read_lines(ids_path, "image id") if ids_path.exists() else None
    n_caps = len(captions)
    n_img = shape[0] if shape else None
    if ids is not None and n_img is None:
        n_img = len(ids) if len(ids) != n_caps else None
    if n_img is None:
        raise XmrError(f"{src}: cannot tell how many images split {split!r} has (no {ims.name}, no per-image ids)")
    if n_img == 0 or n_caps % n_img:
        raise XmrError(f"{caps_path}: {n_caps} captions for {n_img} images in {ims.name}; expected a whole "
                       f"number of captions per image (SCAN: 5)")
    im_div = n_caps // n_img
    if ids is not None:
        if len(ids) == n_caps and im_div > 1:  # one id per caption: must be constant within each image
            for k in range(n_img):
                group = ids[k * im_div: (k + 1) * im_div]
                if len(set(group)) != 1:
                    raise XmrError(f"{ids_path}:{k * im_div + 1}: ids of image row {k} differ ({group}); "
                                   f"expected {im_div} equal ids per image")
            ids = ids[::im_div]
        elif len(ids) != n_img:
            raise XmrError(f"{ids_path}: {len(ids)} ids for {n_img} images / {n_caps} captions")
        if len(set(ids)) != len(ids):
            dup = next(i for i, n in Counter(ids).items() if n > 1)
            raise XmrError(f"{ids_path}: image id {dup} appears on two image rows")
    image_ids = ids if ids is not None else [str(i) for i in range(n_img)]
    return PrecompFiles(ims, caps_path, ids_path if ids_path.exists() else None, captions, image_ids, n_img,
                        im_div, shape)


@DATASET_READERS.register("precomp")
def read_precomp_split(cfg: dict, split: str) -> CaptionedSplit:
    wanted = cfg.get("splits", {}).get(split, [split])
    if len(wanted) != 1:
        raise XmrError(f"dataset {cfg['name']}: splits.{split} = {wanted}; a precomp split maps to exactly one "
                       f"source split (its features are one {{split}}_ims.npy)")
    root = cfg.get("root") or cfg.get("images")
    if not root:
        raise XmrError(f"dataset {cfg['name']}: set `root:` to the folder holding {{split}}_caps.txt")
    files = read_precomp_files(root, wanted[0], need_features=False)
    c = int(cfg["captions_per_image"])
    if files.im_div != c:
        raise XmrError(f"{files.caps_path}: {files.im_div} captions per image row, but captions_per_image is {c}")
    return CaptionedSplit(
        name=cfg["name"], split=split, image_ids=files.image_ids, image_paths=[], captions=files.captions,
        caption_image=np.repeat(np.arange(files.num_images), c), tokens=[tokenize(t) for t in files.captions],
        extra={"source_split": wanted[0], "features_npy": str(files.ims_path)},
    )
