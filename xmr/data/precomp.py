"""Reader for the SCAN / VSE∞ precomputed layout, for training without images.

One folder (config ``root``, e.g. ``data/coco_precomp`` from SCAN's ``data.zip``) holds, per source split
(``train``, ``dev``, ``test``, and for COCO ``testall`` = the 5K test; COCO ``test`` is only its first 1K)::

    {split}_ims.npy    (N, 36, 2048) float32   BUTD region features, one row per image, or one row per
                       caption (the public ``dev`` splits: COCO 5,000 rows for 1,000 images)
    {split}_caps.txt   one caption per line, 5 consecutive lines per image
    {split}_ids.txt    optional: image ids (COCO ids; Flickr30K Karpathy ``imgid``), one per image row or
                       one per caption (then repeated 5 times)

Images per caption follow vse_infty's ``im_div`` rule: when the file has fewer image rows than captions,
caption j belongs to row j // (captions / rows). When it has as many rows as captions, every caption has its
own row: xmr groups the rows of one image (by ``_ids.txt``, which then repeats each id once per caption, or
without it ``captions_per_image`` consecutive rows, vse_infty's ``img_embs[::5]``), checks on import that
they hold identical features (an error names the image and rows otherwise) and keeps one. A 2-D
``(N, D)`` file (pooled vectors) is read only when the dataset config says ``extra: {pooled: true}``.

Image ids are the ``_ids.txt`` ids, or the row numbers ``0..N-1`` when there is no ids file; ``xmr
import-features --format scan`` gives the feature file the same ids, so the two always match. Map xmr's
splits to the source splits with ``splits:`` (``{train: [train], val: [dev], test: [testall]}`` for COCO 5K).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xmr.core.errors import XmrError
from xmr.data.base import DATASET_READERS, CaptionedSplit
from xmr.data.karpathy import tokenize


@dataclass
class PrecompFiles:
    """The files of one source split of a SCAN precomputed folder, checked for consistency.

    ``rows[k]`` is the ``_ims.npy`` row holding image k. In the one-row-per-caption layout (the public
    ``dev`` splits: COCO 5,000 rows for 1,000 images, Flickr30K 5,070 for 1,014) ``row_groups[k]`` lists all
    rows of image k (they must hold identical features; the importer checks) and ``captions`` are grouped
    per image in order of first appearance (the file order when, as in the downloads, an image's rows are
    consecutive)."""

    ims_path: Path
    caps_path: Path
    ids_path: Path | None
    captions: list[str]
    image_ids: list[str]
    num_images: int
    im_div: int
    shape: tuple[int, ...]
    rows: np.ndarray
    row_groups: list[np.ndarray] | None = None
    pooled: bool = False


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


def _group_rows(keys: list[str], where: str) -> tuple[list[str], list[np.ndarray]]:
    """Rows with equal keys -> one group per key, in order of first appearance; every group the same size."""
    groups: dict[str, list[int]] = {}
    for r, key in enumerate(keys):
        groups.setdefault(key, []).append(r)
    sizes = Counter(len(g) for g in groups.values())
    if len(sizes) > 1:
        size = sizes.most_common(1)[0][0]
        key, g = next((k, g) for k, g in groups.items() if len(g) != size)
        raise XmrError(f"{where}:{g[0] + 1}: image id {key} is on {len(g)} rows (lines "
                       f"{', '.join(str(r + 1) for r in g[:6])}), the others on {size}; one row per caption "
                       f"needs the same number of captions per image")
    return list(groups), [np.asarray(g, dtype=np.int64) for g in groups.values()]


def read_precomp_files(src_dir: str | Path, split: str, need_features: bool = True, pooled: bool = False,
                       captions_per_image: int = 5) -> PrecompFiles:
    """Check and read one source split. ``pooled``: a 2-D ``(N, D)`` ``_ims.npy`` (one pooled vector per
    image) is accepted only then. ``captions_per_image``: the group size for a one-row-per-caption file
    without an ids file (vse_infty's ``img_index // 5`` reading); with ids, rows are grouped by id."""
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
            raise XmrError(f"{ims}: expected float features N x R x D (SCAN: N x 36 x 2048), got {arr.dtype} "
                           f"{' x '.join(map(str, shape)) or 'a scalar'}")
        if arr.ndim == 2 and not pooled:
            raise XmrError(f"{ims}: 2-D array {shape[0]} x {shape[1]}; expected N x R x D region features "
                           f"(SCAN: N x 36 x 2048). If these are pooled vectors (one per image), say so: "
                           f"`extra: {{pooled: true}}` in the dataset config or `xmr import-features --pooled`")
    elif need_features:
        raise XmrError(f"{ims}: not found; the SCAN download holds {split}_ims.npy next to {caps_path.name}")
    else:
        shape = ()
    captions = read_lines(caps_path, "caption")
    ids = read_lines(ids_path, "image id") if ids_path.exists() else None
    n_caps = len(captions)
    n_rows = shape[0] if shape else None
    if ids is not None and n_rows is None:
        n_rows = len(ids)
    if n_rows is None:
        raise XmrError(f"{src}: cannot tell how many images split {split!r} has (no {ims.name}, no {ids_path.name})")
    if n_rows == 0 or n_caps % n_rows:
        raise XmrError(f"{caps_path}: {n_caps} captions for {n_rows} images in {ims.name}; expected a whole "
                       f"number of captions per image (SCAN: 5)")
    row_groups = None
    if ids is not None and len(ids) != n_rows:
        if len(ids) == n_caps and n_caps > n_rows:  # one id per caption, rows per image: constant within an image
            im_div = n_caps // n_rows
            for k in range(n_rows):
                group = ids[k * im_div: (k + 1) * im_div]
                if len(set(group)) != 1:
                    raise XmrError(f"{ids_path}:{k * im_div + 1}: ids of image row {k} differ ({group}); "
                                   f"expected {im_div} equal ids per image")
            ids = ids[::im_div]
        else:
            raise XmrError(f"{ids_path}: {len(ids)} ids for {n_rows} image rows / {n_caps} captions")
    if n_rows == n_caps and ((ids is not None and len(set(ids)) < len(ids))
                             or (ids is None and captions_per_image > 1)):
        # one feature row per caption (public dev splits): collapse each image's rows, captions grouped per image
        if ids is None:
            if n_rows % captions_per_image:
                raise XmrError(f"{ims}: {n_rows} rows, one per caption, not a multiple of captions_per_image="
                               f"{captions_per_image}; add {ids_path.name} (one image id per row)")
            row_groups = [np.arange(k, k + captions_per_image) for k in range(0, n_rows, captions_per_image)]
            ids = [str(k) for k in range(len(row_groups))]
        else:
            ids, row_groups = _group_rows(ids, str(ids_path))
        order = np.concatenate(row_groups)
        captions = [captions[r] for r in order]
        rows = np.asarray([g[0] for g in row_groups], dtype=np.int64)
        im_div = len(row_groups[0])
    else:
        if ids is not None and len(set(ids)) != len(ids):
            dup = next(i for i, n in Counter(ids).items() if n > 1)
            where = [str(r + 1) for r, i in enumerate(ids) if i == dup][:2]
            raise XmrError(f"{ids_path}: image id {dup} appears on two image rows (lines {' and '.join(where)})")
        rows = np.arange(n_rows, dtype=np.int64)
        im_div = n_caps // n_rows
    image_ids = ids if ids is not None else [str(i) for i in range(n_rows)]
    return PrecompFiles(ims, caps_path, ids_path if ids_path.exists() else None, captions, image_ids,
                        len(rows), im_div, shape, rows, row_groups, len(shape) == 2)


@DATASET_READERS.register("precomp")
def read_precomp_split(cfg: dict, split: str) -> CaptionedSplit:
    wanted = cfg.get("splits", {}).get(split, [split])
    if len(wanted) != 1:
        raise XmrError(f"dataset {cfg['name']}: splits.{split} = {wanted}; a precomp split maps to exactly one "
                       f"source split (its features are one {{split}}_ims.npy)")
    root = cfg.get("root") or cfg.get("images")
    if not root:
        raise XmrError(f"dataset {cfg['name']}: set `root:` to the folder holding {{split}}_caps.txt")
    c = int(cfg["captions_per_image"])
    files = read_precomp_files(root, wanted[0], need_features=False,
                               pooled=bool(cfg.get("extra", {}).get("pooled", False)), captions_per_image=c)
    if files.im_div != c:
        raise XmrError(f"{files.caps_path}: {files.im_div} captions per image row, but captions_per_image is {c}")
    return CaptionedSplit(
        name=cfg["name"], split=split, image_ids=files.image_ids, image_paths=[], captions=files.captions,
        caption_image=np.repeat(np.arange(files.num_images), c), tokens=[tokenize(t) for t in files.captions],
        extra={"source_split": wanted[0], "features_npy": str(files.ims_path),
               "rows_per_caption": files.row_groups is not None},
    )
