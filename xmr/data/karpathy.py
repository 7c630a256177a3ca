"""Reader for the Karpathy split JSON used by COCO, Flickr30K (``dataset_{coco,flickr30k}.json``) and ``synth``.

Format: ``{"images": [{"filename", "filepath"?, "split", "imgid", "sentids", "sentences": [{"raw", "tokens",
"imgid", "sentid"}], "label"?}]}``. A split may gather several Karpathy splits (COCO's train = train + restval).
Images with more captions than ``captions_per_image`` keep their first ones (as the released precomputed
features do); fewer is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from xmr.data.base import DATASET_READERS, CaptionedSplit
from xmr.errors import XmrError
from xmr.io import require_file


def read_karpathy_json(path: Path) -> list[dict]:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise XmrError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
        raise XmrError(f"{path}: not a Karpathy split file (expected a top-level 'images' list)")
    for i, img in enumerate(doc["images"]):
        for key in ("filename", "split", "sentences"):
            if key not in img:
                raise XmrError(f"{path}: images[{i}] has no '{key}' field")
        for j, s in enumerate(img["sentences"]):
            if "raw" not in s:
                raise XmrError(f"{path}: images[{i}].sentences[{j}] has no 'raw' field")
    return doc["images"]


@DATASET_READERS.register("karpathy")
def read_karpathy_split(cfg: dict, split: str) -> CaptionedSplit:
    ann = require_file(cfg["annotations"], cfg.get("obtain", "see README 'Datasets'"))
    images = read_karpathy_json(ann)
    wanted = cfg.get("splits", {}).get(split, [split])
    c = int(cfg["captions_per_image"])
    image_root = Path(cfg["images"])
    ids, paths, caps, toks, labels = [], [], [], [], []
    for img in images:
        if img["split"] not in wanted:
            continue
        sents = img["sentences"]
        if len(sents) < c:
            raise XmrError(
                f"{ann}: image {img['filename']} has {len(sents)} captions, fewer than captions_per_image={c}"
            )
        ids.append(str(img.get("cocoid", img.get("imgid", img["filename"]))))
        paths.append(image_root / img.get("filepath", "") / img["filename"])
        for s in sents[:c]:
            caps.append(s["raw"].strip())
            toks.append(s.get("tokens") or tokenize(s["raw"]))
        labels.append(img.get("label", -1))
    if not ids:
        raise XmrError(f"{ann}: no images in split {split!r} (Karpathy splits used: {wanted})")
    lab = np.asarray(labels, dtype=np.int64)
    return CaptionedSplit(
        name=cfg["name"],
        split=split,
        image_ids=ids,
        image_paths=paths,
        captions=caps,
        caption_image=np.repeat(np.arange(len(ids)), c),
        tokens=toks,
        image_labels=lab if (lab >= 0).all() else None,
    )


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens (letters/digits), the normalisation Karpathy's ``tokens`` use."""
    import re

    return re.findall(r"[a-z0-9]+", text.lower())
