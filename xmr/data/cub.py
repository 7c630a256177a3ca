"""Reader for CUB Captions: CUB-200-2011 images with the 10 captions per image of Reed et al. (2016).

On disk (config keys in brackets)::

    [images]   CUB_200_2011/images.txt               "<image id> <class folder>/<file>.jpg"
               CUB_200_2011/image_class_labels.txt   "<image id> <class id 1..200>"
               CUB_200_2011/classes.txt              "<class id> <class folder>", e.g. "1 001.Black_footed_Albatross"
               CUB_200_2011/images/<class folder>/<file>.jpg
    [extra.text_dir]  text_c10/<class folder>/<file>.txt   one caption per line (10 per image)

Splits are class-disjoint (the zero-shot split of Reed et al. / Xian et al. that PCME and DVSE use): 150
train+val classes and 50 unseen test classes. Source splits (map them to xmr splits with ``splits:``):

- ``train``: images of the train+val classes, minus the held-out ones;
- ``heldout``: the held-out images of the train+val classes (PCME's in-domain validation ``val_in``);
- ``test``: all images of the test classes;
- ``all``: every image.

Split settings under ``extra`` (defaults in brackets). ``auto`` follows PCME's split files
(``datasets/annotations/cub/`` of naver-ai/pcme) when they are in ``extra.split_dir`` [the dataset ``root``,
``data/cub``], and falls back to the rule in parentheses when they are not; which one was used is printed
and recorded (``CaptionedSplit.extra['split_rule']``, the training run's ``split_rule`` tag):

- ``test_classes`` [``auto``: ``testclasses.txt``, else ``builtin``]: ``builtin`` (the 50 classes below, the
  same as PCME's ``testclasses.txt``) or a class-list file (one ``NNN.Name`` or ``NNN`` per line);
- ``trainval_classes`` [``auto``: ``trainvalclasses.txt``, else null]: null (all classes not in test) or a
  class-list file;
- ``heldout_images`` [``auto``: ``seen_test_images.txt``, else 5]: an integer k (every k-th image of each
  train+val class, in ``images.txt`` order, is held out: a deterministic ~1/k) or a file of
  ``<class folder>/<file>.jpg`` lines (PCME's ``seen_test_images.txt``; entries of test classes in it are
  ignored, as in PCME).

An empty split is an error that names the split files to provide.

Image ids are CUB's ``images.txt`` ids; ``image_labels`` are class ids - 1 (0..199), for class-level relevance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from xmr.core.errors import XmrError
from xmr.core.io import require_file
from xmr.data.base import DATASET_READERS, CaptionedSplit
from xmr.data.karpathy import tokenize

#: The 50 unseen test classes (CUB class ids) of Reed et al. 2016 / Xian et al. 2017 as shipped by PCME
#: (naver-ai/pcme ``datasets/annotations/cub/testclasses.txt``).
BUILTIN_TEST_CLASSES = (
    4, 12, 23, 26, 28, 31, 33, 43, 45, 49, 52, 55, 70, 72, 77, 84, 87, 91, 94, 97, 98, 103, 104, 111, 113,
    119, 123, 124, 127, 130, 132, 136, 138, 139, 143, 148, 156, 157, 161, 163, 164, 165, 168, 169, 173, 180,
    188, 190, 191, 200,
)
SOURCE_SPLITS = ("train", "heldout", "test", "all")
#: extra key -> (PCME's file name, the fallback when the file is absent)
PCME_SPLIT_FILES = {"test_classes": ("testclasses.txt", "builtin"), "trainval_classes": ("trainvalclasses.txt", None),
                    "heldout_images": ("seen_test_images.txt", 5)}
_announced: set[str] = set()


def resolve_split_settings(cfg: dict) -> tuple[dict, str]:
    """``auto`` split settings -> PCME's files when present in ``extra.split_dir``, else the fallbacks;
    returns (settings, a one-line description of the rule used)."""
    extra = cfg.get("extra", {})
    split_dir = Path(extra.get("split_dir") or cfg.get("root") or Path(cfg["images"]).parent)
    out, used, from_files = {}, [], 0
    for key, (name, fallback) in PCME_SPLIT_FILES.items():
        value = extra.get(key, "auto")
        if value == "auto":
            value = str(split_dir / name) if (split_dir / name).is_file() else fallback
        out[key] = value
        is_file = isinstance(value, str) and value != "builtin"
        from_files += is_file
        shown = value if is_file or key != "heldout_images" else f"every {value}th image"
        used.append(f"{key}={shown}")
    kind = "split files" if from_files == 3 else "fallback rule" if from_files == 0 else "mixed settings"
    return out, f"{kind}: {', '.join(used)}"


def _read_table(path: Path, what: str) -> list[tuple[int, str]]:
    """Lines ``<int> <text>`` -> [(int, text)]; errors name the file and line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.split(maxsplit=1)
            if len(parts) != 2 or not parts[0].isdigit():
                raise XmrError(f"{path}:{lineno}: expected '<id> <{what}>', got {line.strip()[:60]!r}")
            rows.append((int(parts[0]), parts[1].strip()))
    return rows


def read_class_list(path: Path, classes: dict[int, str]) -> set[int]:
    """A class-list file (``NNN.Name`` or ``NNN`` per line) -> class ids, checked against ``classes.txt``."""
    out = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            entry = line.strip()
            if not entry:
                continue
            head = entry.split(".", 1)[0]
            if not head.isdigit() or int(head) not in classes:
                raise XmrError(f"{path}:{lineno}: {entry!r} is not a CUB class (expected e.g. "
                               f"'001.Black_footed_Albatross' or '1')")
            cid = int(head)
            if "." in entry and entry != classes[cid]:
                raise XmrError(f"{path}:{lineno}: {entry!r} does not match classes.txt ({classes[cid]!r})")
            out.add(cid)
    return out


def read_captions(path: Path, c: int) -> list[str]:
    if not path.exists():
        raise XmrError(f"{path}: caption file not found; extra.text_dir must hold Reed et al.'s text_c10 "
                       f"folder (<class folder>/<image name>.txt)")
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except UnicodeDecodeError as e:
        raise XmrError(f"{path}: not UTF-8 text (byte {e.start})") from None
    caps = [ln for ln in lines if ln]
    if len(caps) < c:
        raise XmrError(f"{path}: {len(caps)} captions, fewer than captions_per_image={c}")
    return caps[:c]


@DATASET_READERS.register("cub")
def read_cub_split(cfg: dict, split: str) -> CaptionedSplit:
    hint = cfg.get("obtain", "see docs/datasets.md 'CUB Captions'")
    root = Path(cfg["images"])
    extra = cfg.get("extra", {})
    text_dir = Path(extra.get("text_dir") or Path(cfg.get("root", root.parent)) / "text_c10")
    images = _read_table(require_file(root / "images.txt", hint), "class folder/file.jpg")
    label_file = require_file(root / "image_class_labels.txt", hint)
    labels = {}
    for iid, value in _read_table(label_file, "class id"):
        if not value.isdigit():
            raise XmrError(f"{label_file}: image {iid} has class {value!r}, not a class id")
        labels[iid] = int(value)
    classes = dict(_read_table(require_file(root / "classes.txt", hint), "class folder"))
    if not text_dir.is_dir():
        raise XmrError(f"{text_dir}: caption folder not found; {hint}")
    for cid, name in classes.items():
        if not 1 <= cid <= 200:
            raise XmrError(f"{root / 'classes.txt'}: class id {cid} outside 1..200")

    settings, rule = resolve_split_settings(cfg)
    if rule not in _announced:  # once per process: train, val and test all resolve the same rule
        _announced.add(rule)
        print(f"dataset {cfg['name']}: CUB splits from the {rule}", file=sys.stderr, flush=True)
    test_spec = settings["test_classes"]
    test = set(BUILTIN_TEST_CLASSES) if test_spec == "builtin" else read_class_list(require_file(test_spec, hint),
                                                                                  classes)
    tv_spec = settings["trainval_classes"]
    trainval = set(classes) - test if not tv_spec else read_class_list(require_file(tv_spec, hint), classes)
    if trainval & test:
        raise XmrError(f"CUB split: classes {sorted(trainval & test)[:5]} are both train+val and test; the "
                       f"split must be class-disjoint (check extra.test_classes / extra.trainval_classes)")

    held_spec = settings["heldout_images"]
    by_path = {}
    for iid, rel in images:
        if iid not in labels:
            raise XmrError(f"{root / 'image_class_labels.txt'}: no class for image {iid} ({rel})")
        if labels[iid] not in classes:
            raise XmrError(f"{root / 'image_class_labels.txt'}: image {iid} has class {labels[iid]}, "
                           f"not in classes.txt")
        by_path[rel] = iid
    heldout: set[int] = set()
    if isinstance(held_spec, int) and not isinstance(held_spec, bool):
        if held_spec < 2:
            raise XmrError(f"extra.heldout_images: {held_spec}; use an integer k >= 2 or a file of image paths")
        rank: dict[int, int] = {}
        for iid, _ in images:
            cls = labels[iid]
            k = rank.get(cls, 0)
            rank[cls] = k + 1
            if cls in trainval and k % held_spec == held_spec - 1:
                heldout.add(iid)
    else:
        held_file = require_file(held_spec, hint)
        with open(held_file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                rel = line.strip()
                if not rel:
                    continue
                if rel not in by_path:
                    raise XmrError(f"{held_file}:{lineno}: {rel!r} is not in images.txt")
                if labels[by_path[rel]] in trainval:
                    heldout.add(by_path[rel])

    wanted = cfg.get("splits", {}).get(split, [split])
    unknown = [s for s in wanted if s not in SOURCE_SPLITS]
    if unknown:
        raise XmrError(f"dataset {cfg['name']}: CUB source split {unknown[0]!r} in `splits:`; use "
                       f"{', '.join(SOURCE_SPLITS)}")

    def member(iid: int) -> bool:
        cls = labels[iid]
        return (("all" in wanted) or ("test" in wanted and cls in test)
                or ("train" in wanted and cls in trainval and iid not in heldout)
                or ("heldout" in wanted and iid in heldout))

    c = int(cfg["captions_per_image"])
    ids, paths, caps, toks, labs = [], [], [], [], []
    for iid, rel in images:
        if not member(iid):
            continue
        ids.append(str(iid))
        paths.append(root / "images" / rel)
        for cap in read_captions(text_dir / Path(rel).with_suffix(".txt"), c):
            caps.append(cap)
            toks.append(tokenize(cap))
        labs.append(labels[iid] - 1)
    if not ids:
        split_dir = Path(extra.get("split_dir") or cfg.get("root") or root.parent)
        raise XmrError(f"dataset {cfg['name']}: split {split!r} (CUB source splits {wanted}) has no images under "
                       f"the {rule}; put PCME's split files {', '.join(n for n, _ in PCME_SPLIT_FILES.values())} "
                       f"(naver-ai/pcme datasets/annotations/cub/) in {split_dir}/ or set extra.heldout_images")
    return CaptionedSplit(
        name=cfg["name"], split=split, image_ids=ids, image_paths=paths, captions=caps,
        caption_image=np.repeat(np.arange(len(ids)), c), tokens=toks,
        image_labels=np.asarray(labs, dtype=np.int64),
        extra={"classes": {cid - 1: name for cid, name in classes.items()}, "split_rule": rule,
               "run_tags": {"split_rule": rule}},
    )
