"""Import the precomputed features researchers already have into xmr's HDF5 layout (``store.py``).

Two formats:

- ``scan``: the SCAN / VSE∞ precomputed folder (``{split}_ims.npy`` N x 36 x 2048, ``{split}_caps.txt``,
  optional ``{split}_ids.txt``; see :mod:`xmr.data.precomp`). Source splits are ``train``/``dev``/``test``,
  plus ``testall`` (the COCO 5K test; COCO ``test`` is its first 1K).
- ``butd_tsv``: bottom-up-attention ``generate_tsv.py`` output, tab-separated columns ``image_id, image_w,
  image_h, num_boxes, boxes, features`` (boxes and features base64-encoded float32, 10-100 adaptive or 36
  fixed boxes per image); the 10-column LXMERT variant (``img_id, img_h, img_w, objects_id, objects_conf,
  attrs_id, attrs_conf, num_boxes, boxes, features``) is read too. Several files (``*.tsv.0``, ``*.tsv.1``,
  ...) are read as one. Adaptive box counts are zero-padded, ``num_regions`` says how many are real.

Matching to a dataset split (``split=`` a :class:`CaptionedSplit`, e.g. COCO's Karpathy test): the feature
file is written in the split's image order with the split's image ids, so it trains with that dataset's
config directly. SCAN rows are matched by ``{split}_ids.txt`` (COCO ids / Flickr30K ``imgid``), or, without
an ids file, by their captions (each image's captions, normalised, must equal one image's in the split);
with ids the captions are still compared (``verify_captions``). TSV records are matched by ``image_id`` (COCO
id) or by image file stem (Flickr30K TSVs use ``1000092795``); records of other images are skipped. Without
a split, rows keep the source order and ids (SCAN: ids file or row numbers, as the ``precomp`` reader).
"""

from __future__ import annotations

import base64
import binascii
import csv
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from xmr.core.errors import XmrError
from xmr.data.base import CaptionedSplit
from xmr.data.karpathy import tokenize
from xmr.data.precomp import read_precomp_files
from xmr.features.store import ShardWriter

#: xmr split -> SCAN source split, unless the dataset config says otherwise (``extra.scan_splits``)
SCAN_SPLITS = {"train": "train", "val": "dev", "test": "test"}
BUTD_COLUMNS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
LXMERT_COLUMNS = ("img_id", "img_h", "img_w", "objects_id", "objects_conf", "attrs_id", "attrs_conf",
                  "num_boxes", "boxes", "features")
FORMATS = ("scan", "butd_tsv")


def scan_source_split(dataset_cfg: dict, split: str) -> str:
    """The SCAN source split holding xmr split ``split`` of ``dataset_cfg`` (e.g. COCO test -> testall)."""
    if dataset_cfg.get("format") == "precomp":
        return dataset_cfg.get("splits", {}).get(split, [split])[0]
    return dataset_cfg.get("extra", {}).get("scan_splits", {}).get(split, SCAN_SPLITS.get(split, split))


def _discard_parts_on_error(fn):
    """Import functions: a rejected source (or any failure) leaves no ``OUT.parts/`` behind, not even the
    settings stamp; imports are redone from scratch anyway (:func:`_fresh_writer`)."""
    import functools
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BaseException:
            out = Path(sig.bind(*args, **kwargs).arguments["out"])
            shutil.rmtree(out.with_name(out.name + ".parts"), ignore_errors=True)
            raise

    return wrapper


def _fresh_writer(out: str | os.PathLike, num_images: int | None, attrs: dict) -> ShardWriter:
    parts = Path(out).with_name(Path(out).name + ".parts")
    if parts.exists():  # imports are fast to redo; never mix shards of two different sources
        shutil.rmtree(parts)
    return ShardWriter(out, num_images, attrs)


def _caption_key(captions: Iterable[str]) -> tuple[str, ...]:
    return tuple(" ".join(tokenize(c)) for c in captions)


@_discard_parts_on_error
def import_scan(src_dir: str | os.PathLike, src_split: str, out: str | os.PathLike,
                split: CaptionedSplit | None = None, dtype: str = "float32", verify_captions: bool = True,
                block: int = 256, progress: bool = True, pooled: bool = False) -> Path:
    """SCAN precomputed ``{src_split}_ims.npy`` -> ``out`` (HDF5), in ``split``'s order when given.

    ``pooled``: accept a 2-D ``(N, D)`` file (one pooled vector per image, stored as one region). A file
    with one row per caption is collapsed to one row per image after checking the rows are identical.
    On any error nothing is left at ``out`` (nor its ``.parts`` folder)."""
    files = read_precomp_files(src_dir, src_split, pooled=pooled,
                               captions_per_image=split.captions_per_image or 5 if split is not None else 5)
    try:
        return _import_scan(files, src_split, out, split, dtype, verify_captions, block, progress)
    except BaseException:
        parts = Path(out).with_name(Path(out).name + ".parts")
        if parts.exists():
            shutil.rmtree(parts)
        raise


def _check_repeated_rows(files, arr: np.ndarray, lo: int, hi: int) -> None:
    """Rows of one image in a one-row-per-caption file must be identical; errors name the image and rows."""
    for k in range(lo, hi):
        group = files.row_groups[k]
        first = np.asarray(arr[group[0]])
        for r in group[1:]:
            if not np.array_equal(np.asarray(arr[r]), first, equal_nan=True):
                where = files.ids_path.name if files.ids_path else "the row order"
                ids = f" ({where} lines {group[0] + 1} and {r + 1})" if files.ids_path else ""
                raise XmrError(f"{files.ims_path}: rows {group[0]} and {r} hold different features for image "
                               f"{files.image_ids[k]}{ids}; a one-row-per-caption file must repeat each "
                               f"image's features exactly (is {where} right?)")


def _import_scan(files, src_split: str, out: str | os.PathLike, split: CaptionedSplit | None, dtype: str,
                 verify_captions: bool, block: int, progress: bool) -> Path:
    from tqdm import tqdm

    arr = np.load(files.ims_path, mmap_mode="r")
    if arr.ndim == 2:
        arr = arr[:, None, :]
    n, c = files.num_images, files.im_div
    ids = list(files.image_ids)
    if split is None:
        rows, out_ids = np.arange(n), ids
    else:
        per_image = split.captions_per_image
        if per_image is None:
            raise XmrError(f"dataset {split.name} split {split.split}: captions are not grouped per image")
        m = min(c, per_image)
        split_keys = [_caption_key(split.captions[k * per_image: k * per_image + m]) for k in range(split.num_images)]
        scan_keys = [_caption_key(files.captions[k * c: k * c + m]) for k in range(n)]
        if files.ids_path is None:  # no ids file: an image is identified by its captions
            owner: dict[tuple, str | None] = {}
            for key, iid in zip(split_keys, split.image_ids):
                owner[key] = None if key in owner else iid  # None: two images share these captions
            for k, key in enumerate(scan_keys):
                iid = owner.get(key)
                if iid is None:
                    why = "match no image" if key not in owner else "match several images"
                    raise XmrError(f"{files.caps_path}:{k * c + 1}: the captions of image row {k} {why} of "
                                   f"{split.name}/{split.split}; is {src_split!r} the right source split?")
                ids[k] = iid
        target = {iid: r for r, iid in enumerate(split.image_ids)}
        rows = np.empty(n, dtype=np.int64)
        for k, iid in enumerate(ids):
            if iid not in target:
                raise XmrError(f"{files.ids_path}:{k + 1}: image id {iid} is not in {split.name}/{split.split} "
                               f"({split.num_images} images); is {src_split!r} the right source split?")
            rows[k] = target[iid]
        if n != split.num_images:
            have = set(ids)
            first = next(i for i in split.image_ids if i not in have)
            raise XmrError(f"{files.ims_path}: {n} images, but {split.name}/{split.split} has "
                           f"{split.num_images} (e.g. id {first} is missing); is {src_split!r} the right "
                           f"source split (COCO 5K test is 'testall')?")
        if verify_captions and files.ids_path is not None:
            bad = [k for k in range(n) if scan_keys[k] != split_keys[rows[k]]]
            if bad:
                k = bad[0]
                raise XmrError(f"{files.caps_path}:{k * c + 1}: captions of image {ids[k]} differ from "
                               f"{split.name}'s ({len(bad)} of {n} images differ: {files.caps_path.name} "
                               f"{files.captions[k * c]!r} vs {split.captions[rows[k] * per_image]!r}); pass "
                               f"--no-verify-captions if only the wording differs")
        out_ids = split.image_ids
    writer = _fresh_writer(out, n, {
        "backbone": "imported", "source_format": "scan", "source": str(files.ims_path),
        "source_split": src_split, "weights_sha256": "unknown", "pooled": int(files.pooled),
        "dataset": split.name if split else None, "split": split.split if split else src_split, "dtype": dtype,
    })
    np_dtype = np.float16 if dtype == "float16" else np.float32
    bar = tqdm(total=n, desc=f"import {files.ims_path.name}", unit="img", disable=not progress)
    for s in range(0, n, block):
        if files.row_groups is not None:
            _check_repeated_rows(files, arr, s, min(n, s + block))
        chunk = np.asarray(arr[files.rows[s: s + block]], dtype=np_dtype)
        writer.write(s, chunk, np.full(len(chunk), chunk.shape[1]), rows=rows[s: s + block])
        bar.update(len(chunk))
    bar.close()
    return writer.finish(list(out_ids), dtype=dtype)


@dataclass
class TsvRecord:
    path: Path
    line: int
    image_id: str
    image_w: int
    image_h: int
    boxes: np.ndarray     # (K, 4) float32, original-image pixels
    features: np.ndarray  # (K, F) float32


def _b64_floats(field: str, path: Path, line: int, column: str) -> np.ndarray:
    text = field.strip()
    if text.startswith(("b'", 'b"')) and text.endswith(text[1]):  # str(bytes) written by Python 3 ports
        text = text[2:-1]
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise XmrError(f"{path}:{line}: column '{column}' is not valid base64") from None
    if len(raw) % 4:
        raise XmrError(f"{path}:{line}: column '{column}' holds {len(raw)} bytes, not whole float32 values")
    return np.frombuffer(raw, dtype=np.float32)


def _int_field(value: str, path: Path, line: int, column: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise XmrError(f"{path}:{line}: column '{column}' is {value[:30]!r}, not an integer") from None


def read_butd_tsv(paths: Iterable[str | os.PathLike]) -> Iterator[TsvRecord]:
    """Yield the records of one or more BUTD TSV files, checked; errors name the file and line."""
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # one line holds all of an image's features
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise XmrError(f"{path}: TSV file not found")
        with open(path, newline="", encoding="utf-8", errors="strict") as f:
            reader = csv.reader(f, delimiter="\t")
            try:
                for row in reader:
                    line = reader.line_num
                    if not row:
                        continue
                    if len(row) == len(BUTD_COLUMNS):
                        cols = dict(zip(BUTD_COLUMNS, row))
                    elif len(row) == len(LXMERT_COLUMNS):
                        cols = dict(zip(LXMERT_COLUMNS, row))
                        cols["image_id"], cols["image_w"], cols["image_h"] = cols["img_id"], cols["img_w"], cols["img_h"]
                    else:
                        raise XmrError(f"{path}:{line}: {len(row)} tab-separated columns; a BUTD TSV has "
                                       f"{len(BUTD_COLUMNS)} ({', '.join(BUTD_COLUMNS)}) or "
                                       f"{len(LXMERT_COLUMNS)} (LXMERT)")
                    k = _int_field(cols["num_boxes"], path, line, "num_boxes")
                    if k < 1:
                        raise XmrError(f"{path}:{line}: num_boxes is {k}; every image needs at least one box")
                    boxes = _b64_floats(cols["boxes"], path, line, "boxes")
                    if boxes.size != 4 * k:
                        raise XmrError(f"{path}:{line}: 'boxes' holds {boxes.size} floats, expected 4 x num_boxes"
                                       f" = {4 * k}")
                    feats = _b64_floats(cols["features"], path, line, "features")
                    if feats.size == 0 or feats.size % k:
                        raise XmrError(f"{path}:{line}: 'features' holds {feats.size} floats, not a multiple of "
                                       f"num_boxes = {k}")
                    yield TsvRecord(path, line, cols["image_id"].strip(),
                                    _int_field(cols["image_w"], path, line, "image_w"),
                                    _int_field(cols["image_h"], path, line, "image_h"),
                                    boxes.reshape(k, 4), feats.reshape(k, -1))
            except csv.Error as e:
                raise XmrError(f"{path}:{reader.line_num}: malformed TSV ({e})") from None
            except UnicodeDecodeError as e:
                raise XmrError(f"{path}: not a text TSV (undecodable byte at offset {e.start})") from None


@_discard_parts_on_error
def import_butd_tsv(paths: list[str | os.PathLike], out: str | os.PathLike, split: CaptionedSplit | None = None,
                    dtype: str = "float32", block: int = 256, progress: bool = True) -> Path:
    """BUTD TSV file(s) -> ``out`` (HDF5); in ``split``'s order (other images skipped) when given."""
    from tqdm import tqdm

    lookup: dict[str, int] = {}
    if split is not None:
        stems: dict[str, int | None] = {}
        for r, p in enumerate(split.image_paths):
            stems[Path(p).stem] = None if Path(p).stem in stems else r
        lookup = {k: v for k, v in stems.items() if v is not None}
        lookup.update({iid: r for r, iid in enumerate(split.image_ids)})  # ids win over file stems
    writer = _fresh_writer(out, split.num_images if split else None, {
        "backbone": "imported", "source_format": "butd_tsv", "source": ",".join(str(p) for p in paths),
        "weights_sha256": "unknown", "dataset": split.name if split else None,
        "split": split.split if split else None, "dtype": dtype,
    })
    np_dtype = np.float16 if dtype == "float16" else np.float32
    buf: list[tuple[int, TsvRecord]] = []
    seen: dict[int, tuple[Path, int, str]] = {}  # row -> where it came from (no arrays kept)
    seen_ids: dict[str, int] = {}
    written = skipped = 0
    feat_dim: tuple[int, TsvRecord] | None = None

    def flush() -> None:
        nonlocal written
        if not buf:
            return
        k = max(len(rec.boxes) for _, rec in buf)
        feats = np.zeros((len(buf), k, feat_dim[0]), dtype=np_dtype)
        boxes = np.zeros((len(buf), k, 4), dtype=np.float32)
        for i, (_, rec) in enumerate(buf):
            feats[i, : len(rec.boxes)] = rec.features
            boxes[i, : len(rec.boxes)] = rec.boxes
        writer.write(written, feats, np.asarray([len(rec.boxes) for _, rec in buf]), boxes,
                     rows=np.asarray([r for r, _ in buf]),
                     image_wh=np.asarray([[rec.image_w, rec.image_h] for _, rec in buf]),
                     image_ids=[rec.image_id for _, rec in buf])
        written += len(buf)
        buf.clear()

    bar = tqdm(desc="import tsv", unit="img", disable=not progress)
    for rec in read_butd_tsv(paths):
        if split is None:
            row = written + len(buf)
        elif rec.image_id in lookup:
            row = lookup[rec.image_id]
        else:
            skipped += 1
            continue
        row = seen_ids.get(rec.image_id, row)
        if row in seen:
            fp, fl, fid = seen[row]
            raise XmrError(f"{rec.path}:{rec.line}: image {rec.image_id} again (first at {fp}:{fl} as {fid})")
        if feat_dim is None:
            feat_dim = (rec.features.shape[1], rec)
        elif rec.features.shape[1] != feat_dim[0]:
            raise XmrError(f"{rec.path}:{rec.line}: {rec.features.shape[1]}-d features, but "
                           f"{feat_dim[1].path}:{feat_dim[1].line} has {feat_dim[0]}-d")
        seen[row] = (rec.path, rec.line, rec.image_id)
        seen_ids[rec.image_id] = row
        buf.append((row, rec))
        if len(buf) >= block:
            flush()
        bar.update(1)
    flush()
    bar.close()
    if written == 0:
        where = f" for {split.name}/{split.split} ({skipped} records of other images)" if split else ""
        raise XmrError(f"{', '.join(str(p) for p in paths)}: no records{where}")
    if split is not None and written != split.num_images:
        first = next(iid for r, iid in enumerate(split.image_ids) if r not in seen)
        raise XmrError(f"{', '.join(str(p) for p in paths)}: {written} of {split.num_images} images of "
                       f"{split.name}/{split.split} found (e.g. image id {first} is missing)")
    return writer.finish(split.image_ids if split else None, dtype=dtype)
