"""A run's split as a gallery, cached in the run directory: image and caption embeddings, image ids, captions
(and what the evaluator reads of the split: image labels, subsets), so that ``xmr search``, ``xmr.load(run)
.encode_split`` and ``xmr test`` do not re-read and re-encode the split on every call.

``xmr score`` writes ``{run_dir}/gallery_{split}.npz`` (:func:`xmr.run.layout.gallery_cache_file`); a reader that
finds it missing or stale recomputes it. The cache is keyed by the SHA-256 of what the embeddings are made from:
the checkpoint (``best.pt``), ``config.yaml``, the split's image input (its feature file; end to end, the
annotations), its precomputed text features if any, and the dataset's annotation files; a change to any of them
makes the cache stale. Large files' digests are themselves cached by size and mtime (:func:`xmr.core.io.sha256_file`),
so checking the key costs milliseconds. No torch here: ``xmr test`` reads the cache without it.

Beside it, ``xmr score`` stores a set method's set statistics of the split (``{run_dir}/set_stats_{split}.json``,
xmr/evaluation/set_stats.py), keyed the same way; ``xmr test`` copies them into the results file. Scored on another
dataset's split (``--dataset``), the run writes no gallery (it is its own dataset's) and its set statistics as
``set_stats_{dataset}_{split}.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.io import atomic_path, sha256_file
from xmr.run.inputs import RunInputs
from xmr.run.layout import gallery_cache_file
from xmr.settings.run_settings import RunSettings

FORMAT = 2  # 2: the images' file paths (``image_paths``)


def input_files(settings: RunSettings, split: str) -> dict[str, Path]:
    """The files a run's embeddings of ``split`` are made from, besides its checkpoint and config
    (:class:`xmr.run.inputs.RunInputs`)."""
    return RunInputs.of(settings, split).files()


def cache_key(run_dir: str | os.PathLike, settings: RunSettings, split: str) -> dict[str, str] | None:
    """Digests the cache of ``split`` must have been written with; None when an input is missing (no cache)."""
    run_dir = Path(run_dir)
    files = {"checkpoint": run_dir / "best.pt", "config": run_dir / "config.yaml", **input_files(settings, split)}
    if not all(p.is_file() for p in files.values()):
        return None
    return {"format": str(FORMAT), "split": split, **{k: sha256_file(p) for k, p in files.items()}}


def read_gallery(run_dir: str | os.PathLike, settings: RunSettings, split: str) -> dict[str, Any] | None:
    """The cached gallery of ``split`` (``image_emb``, ``text_emb`` as float32 arrays, ``image_ids``,
    ``image_paths`` (or None: a features-only dataset), ``captions``, ``caption_image``, ``image_labels`` (or None),
    ``subsets`` (or None), ``positives`` (``{"source", "t2i": each caption's positive image rows}`` or None)), or None when it is missing, unreadable or stale."""
    path = gallery_cache_file(run_dir, split)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(str(arrays.pop("meta")))
    except (OSError, ValueError, KeyError):  # torn or foreign: recomputed like a missing one
        return None
    if meta.get("key") != cache_key(run_dir, settings, split):
        return None
    subsets = {name: {"images": arrays.pop(f"subset_images.{name}"), "captions": arrays.pop(f"subset_captions.{name}")}
               for name in meta["subsets"]} if meta.get("subsets") is not None else None
    positives = None
    if "positives_indptr" in arrays:  # a dataset's extended positives: each caption's image rows
        ptr, rows = arrays["positives_indptr"], arrays["positives_rows"]
        positives = {"source": meta["positives"], "t2i": [rows[ptr[j]:ptr[j + 1]] for j in range(len(ptr) - 1)]}
    return {"split": split, "image_emb": arrays["image_emb"], "text_emb": arrays["text_emb"],
            "image_ids": [str(i) for i in arrays["image_ids"]],
            "image_paths": [str(p) for p in arrays["image_paths"]] if "image_paths" in arrays else None,
            "captions": [str(c) for c in arrays["captions"]],
            "caption_image": [int(i) for i in arrays["caption_image"]],
            "image_labels": arrays.get("image_labels"), "subsets": subsets, "positives": positives}


def write_gallery(run_dir: str | os.PathLike, settings: RunSettings, split: str, data, image_emb: np.ndarray,
                  text_emb: np.ndarray) -> Path | None:
    """Cache the embeddings of ``data`` (a :class:`xmr.data.base.CaptionedSplit`, encoded whole) atomically;
    returns the file, or None when the run directory cannot take it (a read-only run: nothing is cached)."""
    key = cache_key(run_dir, settings, split)
    if key is None:
        return None
    subsets = data.extra.get("subsets")
    arrays = {"image_emb": np.asarray(image_emb, dtype=np.float32), "text_emb": np.asarray(text_emb, dtype=np.float32),
              "image_ids": np.asarray([str(i) for i in data.image_ids]),
              "captions": np.asarray([str(c) for c in data.captions]),
              "caption_image": np.asarray(data.caption_image, dtype=np.int64),
              "meta": np.asarray(json.dumps({"key": key, "subsets": sorted(subsets) if subsets else None,
                                             "positives": (data.extra.get("positives") or {}).get("source")}))}
    if data.image_labels is not None:
        arrays["image_labels"] = np.asarray(data.image_labels)
    if data.image_paths:
        arrays["image_paths"] = np.asarray([str(p) for p in data.image_paths])
    if data.extra.get("positives"):
        lists = data.extra["positives"]["t2i"]
        arrays["positives_indptr"] = np.cumsum([0] + [len(x) for x in lists]).astype(np.int64)
        arrays["positives_rows"] = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists])
    for name, parts in (subsets or {}).items():
        arrays[f"subset_images.{name}"] = np.asarray(parts["images"])
        arrays[f"subset_captions.{name}"] = np.asarray(parts["captions"])
    path = gallery_cache_file(run_dir, split)
    try:
        with atomic_path(path, ".npz") as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
    except (OSError, XmrError):  # a read-only or full disk: the gallery is recomputed next time
        return None
    return path


def set_statistics_file(run_dir: str | os.PathLike, split: str, other_dataset: str | None = None) -> Path:
    """``{run_dir}/set_stats_{split}.json``: what ``xmr score`` measured of a set method's sub-embeddings on ``split``
    (``set_stats_{other_dataset}_{split}.json``: on another dataset's split, ``xmr score --dataset``)."""
    return Path(run_dir) / f"set_stats_{other_dataset + '_' if other_dataset else ''}{split}.json"


def write_set_statistics(run_dir: str | os.PathLike, settings: RunSettings, split: str,
                         stats: dict[str, Any], other_dataset: str | None = None) -> Path | None:
    """Store ``stats`` keyed like the gallery cache (checkpoint, config, the split's inputs), atomically; None (and
    nothing written) when the key cannot be made or the run directory is read-only. ``other_dataset``: ``settings``
    are of another dataset than the run's (:func:`xmr.run.config.on_dataset`)."""
    from xmr.core.io import write_json

    key = cache_key(run_dir, settings, split)
    if key is None:
        return None
    path = set_statistics_file(run_dir, split, other_dataset)
    try:
        write_json(path, {"key": key, "split": split, **stats})
    except (OSError, XmrError):
        return None
    return path


def read_set_statistics(run_dir: str | os.PathLike, settings: RunSettings, split: str,
                        other_dataset: str | None = None) -> dict[str, Any] | None:
    """The set statistics ``xmr score`` stored for ``split`` (of ``other_dataset``, when given), or None when
    missing or stale (another checkpoint)."""
    from xmr.core.io import read_json

    path = set_statistics_file(run_dir, split, other_dataset)
    key = cache_key(run_dir, settings, split)
    if key is None or not path.is_file():
        return None
    doc = read_json(path)
    if doc.pop("key", None) != key:
        return None
    return doc
