"""Reader for caption tables (``format: csv``): a CSV or TSV file with one row per caption, a column holding the
image's path and one holding the caption, as open_clip reads them (``--csv-img-key``, ``--csv-caption-key``,
``--csv-separator``).

Settings (``csv:`` in the dataset config, ``xmr/schemas/dataset.schema.yaml``): ``separator`` (default: from the
file's extension, ``.csv`` a comma, ``.tsv`` a tab), ``image_column`` (default ``filepath``), ``caption_column``
(default ``title``), and the split: either ``split_column`` (a column naming each row's split; every row of an
image must name the same one) or ``split_fractions`` with ``split_seed``, which assigns whole images (all their
captions together) by :func:`assign_by_fractions`.

The rows of an image (its path as written) are gathered in file order, images in the order of their first row;
image paths are relative to ``images:`` (default: the table's folder) and are the image ids. The rows become
Karpathy-style image records, assembled into splits by the Karpathy reader's one assembly
(:func:`xmr.data.karpathy.split_of_images`), so both formats give the same errors: ``captions.csv: line 7: empty
caption (image a.png); ...``.
"""

from __future__ import annotations

import csv
import hashlib
from functools import lru_cache
from pathlib import Path

from xmr.core.errors import XmrError
from xmr.core.io import require_file
from xmr.data.base import DATASET_READERS, CaptionedSplit
from xmr.data.karpathy import split_of_images

#: a table's separator when the dataset config names none, by file extension
SEPARATORS = {".csv": ",", ".tsv": "\t"}


def table_separator(path: str | Path, settings: dict) -> str:
    """The column separator of the caption table ``path``: ``settings['separator']``, else by its extension."""
    if settings.get("separator"):
        return settings["separator"]
    sep = SEPARATORS.get(Path(path).suffix.lower())
    if sep is None:
        raise XmrError(f"{path}: cannot tell the column separator from the extension {Path(path).suffix!r}; set "
                       f"csv.separator in the dataset config (',' or '\\t'), or name the file .csv or .tsv")
    return sep


def assign_by_fractions(images: list[str], fractions: dict[str, float], seed: int) -> dict[str, str]:
    """Image -> split, for whole images: order the images by the SHA-256 hex digest of ``"{seed}:{image}"``
    (``image`` as written in the table); with N images and the splits in the order ``fractions`` names them, the
    first ``round(f1 * N)`` go to the first split, the images up to ``round((f1 + f2) * N)`` to the second, ...,
    the rest to the last (halves round up). An image keeps its split when others are added or removed, unless a
    cut moves past it."""
    order = sorted(images, key=lambda p: hashlib.sha256(f"{seed}:{p}".encode("utf-8")).hexdigest())
    names = list(fractions)
    out: dict[str, str] = {}
    start, cumulative = 0, 0.0
    for k, name in enumerate(names):
        cumulative += fractions[name]
        end = len(order) if k == len(names) - 1 else min(int(cumulative * len(order) + 0.5), len(order))
        out.update((p, name) for p in order[start:end])
        start = end
    return out


def read_caption_table(path: str | Path, settings: dict) -> tuple[list[dict], list[list[int]]]:
    """``(images, lines)`` of a caption table read with the dataset config's ``csv:`` ``settings``: Karpathy-style
    records (``filename``, ``split``: the split column's value or None, ``sentences[].raw``) in the order of each
    image's first row, and the file line of each of their captions (cached per file version)."""
    path = Path(path)
    st = path.stat()
    return _read_cached(str(path), str(path.resolve()), st.st_mtime_ns, st.st_size, table_separator(path, settings),
                        settings["image_column"], settings["caption_column"], settings.get("split_column"))


@lru_cache(maxsize=4)
def _read_cached(path_str: str, _resolved: str, _mtime: int, _size: int, sep: str, image_col: str, caption_col: str,
                 split_col: str | None) -> tuple[list[dict], list[list[int]]]:
    path = Path(path_str)  # as the config names it: errors show the path the user wrote
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(_rows(path, f, sep, image_col, caption_col, split_col))
    except UnicodeDecodeError as e:
        raise XmrError(f"{path}: not UTF-8 text (byte {e.start}); save the table as UTF-8") from None
    except csv.Error as e:
        raise XmrError(f"{path}: not a readable table ({e}); check csv.separator and the quoting") from None
    if not rows:
        raise XmrError(f"{path}: no rows below the header; write one row per caption")
    by_image: dict[str, int] = {}
    images: list[dict] = []
    lines: list[list[int]] = []
    for line, image, caption, split in rows:
        i = by_image.setdefault(image, len(images))
        if i == len(images):
            images.append({"filename": image, "split": split, "sentences": []})
            lines.append([])
        elif split != images[i]["split"]:
            raise XmrError(f"{path}: line {line}: image {image} is in split {split!r} here but "
                           f"{images[i]['split']!r} on line {lines[i][0]}; give every row of an image the same "
                           f"{split_col}")
        images[i]["sentences"].append({"raw": caption})
        lines[i].append(line)
    return images, lines


def _rows(path: Path, f, sep: str, image_col: str, caption_col: str, split_col: str | None):
    """``(line, image, caption, split or None)`` per data row, checking the header and each row's width."""
    reader = csv.reader(f, delimiter=sep)
    header = next(reader, None)
    if header is None:
        raise XmrError(f"{path}: empty file; write a header row naming the columns, then one row per caption")
    columns = {name.strip(): k for k, name in enumerate(header)}
    wanted = {"csv.image_column": image_col, "csv.caption_column": caption_col}
    if split_col:
        wanted["csv.split_column"] = split_col
    for key, name in wanted.items():
        if name not in columns:
            shown = ", ".join(repr(c) for c in columns) if len(header) > 1 else repr(header[0])
            hint = "" if len(header) > 1 else "; is csv.separator right?"
            raise XmrError(f"{path}: no column {name!r} ({key} in the dataset config); the header has {shown}{hint}")
    start = reader.line_num
    for row in reader:
        line, start = start + 1, reader.line_num
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        if len(row) != len(header):
            raise XmrError(f"{path}: line {line}: {len(row)} columns, the header has {len(header)}; check "
                           f"csv.separator and quote fields that contain it")
        image = row[columns[image_col]].strip()
        if not image:
            raise XmrError(f"{path}: line {line}: empty {image_col}; give the image's path or delete the row")
        split = row[columns[split_col]].strip() if split_col else None
        if split == "":
            raise XmrError(f"{path}: line {line}: empty {split_col}; name the row's split (e.g. train, val, test)")
        yield line, image, row[columns[caption_col]], split


@DATASET_READERS.register("csv")
def read_caption_table_split(cfg: dict, split: str) -> CaptionedSplit:
    ann = require_file(cfg["annotations"], cfg.get("obtain", "see docs/datasets.md"))
    settings = cfg["csv"]
    images, lines = read_caption_table(ann, settings)
    if settings.get("split_fractions"):
        fractions = settings["split_fractions"]
        assigned = assign_by_fractions([img["filename"] for img in images], fractions, settings["split_seed"])
        images = [{**img, "split": assigned[img["filename"]]} for img in images]
        for name in cfg.get("splits", {}).get(split, [split]):
            if name in fractions and name not in assigned.values():
                raise XmrError(f"{ann}: csv.split_fractions give split {name!r} none of the {len(images)} images; "
                               f"raise its fraction or add images")

    def place(i: int, j: int | None) -> str:
        return f"line {lines[i][0 if j is None else j]}"

    return split_of_images(cfg, split, ann, images, place, "row")
