"""Reader for the Karpathy split JSON used by COCO, Flickr30K (``dataset_{coco,flickr30k}.json``) and ``synth``.

Format: ``{"images": [{"filename", "filepath"?, "split", "imgid"?, "cocoid"?, "sentids"?, "sentences": [{"raw",
"tokens"?, "imgid"?, "sentid"?}], "label"?, "objects"?}]}``. Only ``filename``, ``split`` and ``sentences[].raw``
are required (a dataset of your own needs no more; docs/datasets.md "Your own dataset"): without ``cocoid`` or
``imgid`` the image id is the file name, without ``tokens`` the raw text is tokenised (:func:`tokenize`).

- COCO (``dataset_coco.json``, 123,287 images): ``filepath`` is ``train2014`` or ``val2014`` (images live at
  ``<images>/<filepath>/<filename>``); ``cocoid`` is the COCO image id and becomes xmr's image id (it is what
  SCAN's ``{split}_ids.txt`` and BUTD TSVs use); splits are ``train`` (82,783), ``restval`` (30,504), ``val``
  and ``test`` (5,000 each); xmr's train is ``[train, restval]`` (config ``splits``).
- Flickr30K (``dataset_flickr30k.json``, 31,783 images): no ``filepath`` (images at ``<images>/<filename>``);
  the image id is ``imgid`` (0..31782, the index VSE∞'s ``id_mapping.json`` and SCAN's ids use).
- ``synth``: as Flickr30K, plus ``label`` (class) and ``objects[].box`` (pixels), exposed as
  ``CaptionedSplit.image_labels`` and ``extra['boxes']``.
- Any dataset may name evaluation subsets: ``"subsets": ["ambiguous", ...]`` on images and on sentences. They are
  exposed as ``extra['subsets'] = {name: {"images": bool (N,), "captions": bool (M,)}}`` and the evaluator
  reports each one beside the whole test set (image->text over the subset's images, text->image over its
  captions; the gallery is always the whole split).
- Any dataset may list extended positives: ``"positives": [image id, ...]`` on a sentence names the other images
  it is true of (ids as xmr reads them: ``cocoid``, else ``imgid``, else the file name; images outside the split
  are skipped; ``[]``: none). A split where some sentence has the key has them, exposed as
  ``extra['positives'] = {"source", "t2i": each caption's image rows, its own
  image included}``, and the evaluator reports ECCV Caption's metrics over them (``extended`` in results files).
  ``source`` is the dataset config's ``positives_source`` (synth: ``synth_scenes``).

A split may gather several Karpathy splits. Images with more captions than ``captions_per_image`` keep their
first ones (COCO has images with 6 or 7; the released precomputed features keep 5); fewer is an error.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Container

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.io import require_file
from xmr.data.base import DATASET_READERS, CaptionedSplit, images_folder


def read_karpathy_json(path: Path) -> list[dict]:
    """The validated ``images`` list of a Karpathy split file (cached per file version)."""
    path = Path(path)
    st = path.stat()
    return _read_cached(str(path.resolve()), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _read_cached(path_str: str, _mtime: int, _size: int) -> list[dict]:
    path = Path(path_str)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise XmrError(f"{path}: not UTF-8 text (byte {e.start}); is it the Karpathy split JSON?") from None
    except json.JSONDecodeError as e:
        raise XmrError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise XmrError(f"{path}: not a Karpathy split file (expected a top-level 'images' list)")
    for i, img in enumerate(doc["images"]):
        if not isinstance(img, dict):
            raise XmrError(f"{path}: images[{i}] is not an object")
        for key in ("filename", "split", "sentences"):
            if key not in img:
                raise XmrError(f"{path}: images[{i}] has no '{key}' field")
        if not isinstance(img["sentences"], list):
            raise XmrError(f"{path}: images[{i}].sentences is not a list")
        for j, s in enumerate(img["sentences"]):
            if not isinstance(s, dict) or not isinstance(s.get("raw"), str):
                raise XmrError(f"{path}: images[{i}].sentences[{j}] has no 'raw' text")
        for j, obj in enumerate(img.get("objects") or []):
            box = obj.get("box") if isinstance(obj, dict) else None
            if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
                raise XmrError(f"{path}: images[{i}].objects[{j}].box must be [x1, y1, x2, y2] in pixels")
    return doc["images"]


def image_id(img: dict) -> str:
    """xmr's id for a Karpathy image: the COCO id when there is one, else ``imgid``, else the file name."""
    for key in ("cocoid", "imgid"):
        if key in img:
            return str(img[key])
    return str(img["filename"])


#: names an entry of an annotation file in errors: ``(image index, caption index or None) -> "images[3].sentences[1]"``
Place = Callable[[int, "int | None"], str]


def karpathy_place(i: int, j: int | None = None) -> str:
    return f"images[{i}]" + ("" if j is None else f".sentences[{j}]")


@DATASET_READERS.register("karpathy")
def read_karpathy_split(cfg: dict, split: str) -> CaptionedSplit:
    ann = require_file(cfg["annotations"], cfg.get("obtain", "see docs/datasets.md"))
    return split_of_images(cfg, split, ann, read_karpathy_json(ann), karpathy_place, "sentence")


def split_of_images(cfg: dict, split: str, ann: Path, images: list[dict], place: Place,
                    caption_entry: str) -> CaptionedSplit:
    """The :class:`CaptionedSplit` of ``split`` from Karpathy-style image records (``filename``, ``split``,
    ``sentences[].raw``, optional fields as in the module docstring): the one assembly of the Karpathy and the
    caption-table readers. ``place`` names an image or caption entry of ``ann`` in errors; ``caption_entry`` is
    what a caption is in that file (``sentence``, ``row``)."""
    wanted = cfg.get("splits", {}).get(split, [split])
    c = int(cfg["captions_per_image"])
    image_root = images_folder(cfg)
    ids, paths, caps, toks, labels, boxes, sources = [], [], [], [], [], [], []
    img_subsets: list[list[str]] = []
    cap_subsets: list[list[str]] = []
    cap_positives: list[list | None] = []
    seen: dict[str, int] = {}
    for i, img in enumerate(images):
        if img["split"] not in wanted:
            continue
        sents = img["sentences"]
        if len(sents) < c:
            raise XmrError(f"{ann}: {place(i, None)} ({img['filename']}) has {len(sents)} captions, fewer than "
                           f"captions_per_image={c}; add captions or lower captions_per_image in "
                           f"config/datasets/{cfg['name']}.yaml")
        iid = image_id(img)
        if iid in seen:
            raise XmrError(f"{ann}: {place(i, None)} repeats image id {iid} of {place(seen[iid], None)}")
        seen[iid] = i
        ids.append(iid)
        paths.append(image_root / img.get("filepath", "") / img["filename"])
        sources.append(f"{ann} {place(i, None)}")
        for j, s in enumerate(sents[:c]):
            if not s["raw"].strip():  # an empty caption would train and rank as a query of no words
                raise XmrError(f"{ann}: {place(i, j)}: empty caption (image {img['filename']}); write the caption "
                               f"or delete that {caption_entry}")
            caps.append(s["raw"].strip())
            toks.append(s.get("tokens") or tokenize(s["raw"]))
            cap_subsets.append(list(s.get("subsets") or []))
            cap_positives.append(s.get("positives"))  # None: not listed (an empty list: checked, none other)
        img_subsets.append(list(img.get("subsets") or []))
        labels.append(img.get("label", -1))
        if "objects" in img:
            boxes.append(np.asarray([o["box"] for o in img["objects"]], dtype=np.float32).reshape(-1, 4))
    if not ids:
        present = sorted({img["split"] for img in images})
        raise XmrError(f"{ann}: no images in split {split!r} (source splits read: {wanted}; the file has "
                       f"{present}); check `splits:` in config/datasets/{cfg['name']}.yaml")
    lab = np.asarray(labels, dtype=np.int64)
    extra: dict = {"boxes": boxes} if len(boxes) == len(ids) else {}
    names = sorted({n for sub in img_subsets + cap_subsets for n in sub})
    if names:
        extra["subsets"] = {n: {"images": np.asarray([n in sub for sub in img_subsets]),
                                "captions": np.asarray([n in sub for sub in cap_subsets])} for n in names}
    if any(pos is not None for pos in cap_positives):
        row_of = {iid: r for r, iid in enumerate(ids)}
        extra["positives"] = {
            "source": cfg.get("positives_source", "annotations"),
            "t2i": [sorted({j // c} | {row_of[str(v)] for v in pos or [] if str(v) in row_of})
                    for j, pos in enumerate(cap_positives)]}  # a caption that lists none: its own image
    return CaptionedSplit(
        name=cfg["name"],
        split=split,
        image_ids=ids,
        image_paths=paths,
        captions=caps,
        caption_image=np.repeat(np.arange(len(ids)), c),
        tokens=toks,
        image_labels=lab if (lab >= 0).all() else None,
        extra=extra,
        image_sources=sources,
    )


_TOKEN = re.compile(r"[a-z0-9]+")
_TOKEN_OR_MARK = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")


def tokenize(text: str, keep_marks: Container[str] = ()) -> list[str]:
    """Lower-case word tokens (letters/digits), the normalisation Karpathy's ``tokens`` use. Punctuation marks in
    ``keep_marks`` stay as tokens (a model whose training tokens had them, e.g. synth's commas, must see them in
    free-text queries too; COCO's tokens have none)."""
    if not keep_marks:
        return _TOKEN.findall(text.lower())
    return [t for t in _TOKEN_OR_MARK.findall(text.lower()) if t[0].isalnum() or t in keep_marks]


def tokenize_for(text: str, vocab: Container[str]) -> list[str]:
    """Tokens of free text as a trained model's vocabulary expects them: a whitespace-separated word the vocabulary
    holds as it is stays whole (synth's ``shapes:``), any other is split by :func:`tokenize`, keeping the marks the
    vocabulary has (synth's ``,``). For a Karpathy vocabulary (COCO, Flickr30K) this equals :func:`tokenize`."""
    marks = {w for w in vocab if len(w) == 1 and not w.isalnum()} if hasattr(vocab, "__iter__") else set()
    out: list[str] = []
    for word in text.lower().split():
        out.extend([word] if word in vocab else tokenize(word, marks))
    return out
