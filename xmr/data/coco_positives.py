"""ECCV Caption and CxC positives of the COCO 5K test split, read from the installed ``eccv-caption`` package
(Chun et al., ECCV 2022, arXiv:2204.03359; naver-ai/eccv-caption, MIT), never copied into xmr.

The package's data conventions, kept here:

- ``coco_test_ids.npy`` lists the 25,000 COCO caption ids of the Karpathy 5K test split, image-major, five per
  image: the row order of SCAN's and VSE∞'s precomputed test files, and xmr's default order (image row ``i`` is
  the image of captions ``5i .. 5i+4``);
- ``<source>_image_to_caption.json`` maps each *image query* (a COCO image id) to its positive caption ids,
  ``<source>_caption_to_image.json`` each *caption query* to its positive image ids. Only the keys are queries:
  ECCV Caption has 1,261 image and 1,332 caption queries; CxC has 5,000 and 24,972 (a caption CxC lists no
  positive for is not a query);
- R of a query is the number of ids listed for it. Two ECCV image queries list a caption outside the 5K test
  split: it counts in R and can never be retrieved.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from xmr.core.errors import XmrError
from xmr.evaluation.extended import ExtendedPositives, Positives

#: protocol -> annotation prefix in the package (the positives' names: xmr.evaluation.protocols.SOURCE_OF)
PREFIX = {"eccv": "eccv", "cxc": "cxc"}
PACKAGE = "eccv-caption==0.1.0"


def package_data() -> Path:
    """The installed eccv-caption package's data folder (found without importing the package)."""
    spec = importlib.util.find_spec("eccv_caption")
    if spec is None or not spec.submodule_search_locations:
        raise XmrError(f"the ECCV Caption / CxC annotations come from the eccv-caption package; install it "
                       f"(pip install {PACKAGE}, pinned in requirements.txt)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    if not (data / "coco_test_ids.npy").is_file():
        raise XmrError(f"{data}: no coco_test_ids.npy; reinstall {PACKAGE}")
    return data


@functools.lru_cache(maxsize=None)
def _read(name: str) -> dict[int, list[int]]:
    with open(package_data() / f"{name}.json") as f:
        return {int(k): [int(v) for v in vs] for k, vs in json.load(f).items()}


@functools.lru_cache(maxsize=1)
def coco_test_order() -> tuple[np.ndarray, np.ndarray]:
    """(image ids (5000,), caption ids (25000,)) of the COCO 5K test split in the package's order."""
    caps = np.load(package_data() / "coco_test_ids.npy").astype(np.int64)
    owner = _read("original_caption_to_image")
    return np.asarray([owner[int(c)][0] for c in caps[::5]], dtype=np.int64), caps


def _as_ids(ids: Sequence, what: str, flag: str) -> np.ndarray:
    try:
        return np.asarray([int(str(v).strip()) for v in ids], dtype=np.int64)
    except ValueError:
        bad = next(v for v in ids if not str(v).strip().lstrip("-").isdigit())
        raise XmrError(f"{what} {bad!r} is not a COCO id (an integer); give the rows' COCO ids ({flag})") from None


def row_order(image_ids: Sequence | None = None, caption_ids: Sequence | None = None) -> tuple[np.ndarray, np.ndarray]:
    """COCO image id of each matrix row and caption id of each column: the package's order, or the ids given
    (checked: the same 5,000 images; captions, when given, the same 25,000, each under its own image's row)."""
    pkg_images, pkg_caps = coco_test_order()
    if image_ids is None and caption_ids is None:
        return pkg_images, pkg_caps
    if image_ids is not None:
        images = _as_ids(image_ids, "image id", "--image-ids")
        if images.size != pkg_images.size:
            raise XmrError(f"{images.size} image ids for the COCO 5K test split's {pkg_images.size} images; give one "
                           "COCO image id per matrix row (--image-ids)")
        known = np.isin(images, pkg_images)
        if known.mean() < 0.5:  # row numbers, file names: not COCO ids at all
            raise XmrError(f"only {int(known.sum())} of the {images.size} image ids are COCO 5K test images (a dataset "
                           "without COCO ids?); give the rows' COCO image ids (--image-ids, SCAN's test_ids.txt, or "
                           "cocoid in the Karpathy JSON)")
        if not known.all() or np.unique(images).size != images.size:
            row = int(np.argmin(known)) if not known.all() else int(np.flatnonzero(
                np.isin(images, images[np.unique(images, return_counts=True)[1] > 1]))[1])
            raise XmrError(f"image id {images[row]} (row {row}) is not one of the COCO 5K test images (or repeats); "
                           "give the rows' COCO image ids in the order of the matrix (--image-ids)")
    else:
        images = pkg_images
    if caption_ids is None:  # each image's five captions in the package's order
        where = {int(i): k for k, i in enumerate(pkg_images)}
        caps = pkg_caps.reshape(-1, 5)[[where[int(i)] for i in images]].reshape(-1)
        return images, caps
    caps = _as_ids(caption_ids, "caption id", "--caption-ids")
    if caps.size != pkg_caps.size:
        raise XmrError(f"{caps.size} caption ids for the COCO 5K test split's {pkg_caps.size} captions; give one "
                       "COCO caption id per matrix column (--caption-ids)")
    owner = _read("original_caption_to_image")
    for col, c in enumerate(caps.tolist()):  # 25,000 dict look-ups: reading ids, not scoring queries
        if c not in owner or owner[c][0] != images[col // 5]:
            raise XmrError(f"caption id {c} (column {col}) is not a COCO 5K test caption of image {images[col // 5]} "
                           f"(row {col // 5}); give caption ids in the matrix's column order (--caption-ids)")
    return images, caps


def coco_positives(protocol: str, image_ids: Sequence | None = None,
                   caption_ids: Sequence | None = None) -> ExtendedPositives:
    """The ECCV Caption (``eccv``) or CxC (``cxc``) positives as matrix indices, rows/columns ordered by
    :func:`row_order`."""
    from xmr.evaluation.protocols import SOURCE_OF

    prefix, source = PREFIX[protocol], SOURCE_OF[protocol]
    images, caps = row_order(image_ids, caption_ids)
    row = {int(i): k for k, i in enumerate(images)}
    col = {int(c): k for k, c in enumerate(caps)}
    i2t, t2i = _read(f"{prefix}_image_to_caption"), _read(f"{prefix}_caption_to_image")
    return ExtendedPositives(
        source,
        Positives.from_lists([row[i] for i in i2t], [[col[c] for c in v if c in col] for v in i2t.values()],
                             [len(set(v)) for v in i2t.values()]),
        Positives.from_lists([col[c] for c in t2i], [[row[i] for i in v if i in row] for v in t2i.values()],
                             [len(set(v)) for v in t2i.values()]))
