"""The embedded ``synth`` dataset: rendered scenes of coloured shapes with partial yet specific captions.

Two styles (``generate.style``):

- ``v2`` (default): 3-5 objects (10 shapes x 8 colours x 2 sizes) per image. Each of an image's captions names a
  *different part* of the scene (a pair of objects and their spatial relation, three objects, or one small object
  with its place in the frame), always with size, colour and shape, so a caption is rarely true of another image
  (``false_negative_rate_b128`` of :func:`synth_stats` about 2 %): the papers' hardest-negative objectives work.
  Every sentence stores its meaning (``semantics``: named objects, relations, object count), from which the truth
  of any caption about any image is decided (:func:`caption_true_of`). Images with 5+ objects and the captions
  naming one small object in them form the ``ambiguous`` evaluation subset (``subsets`` in the JSON), reported
  separately by the evaluator: the partial-description case that set-based methods target.
- ``v1``: the first version (2-4 objects, captions often true of many images: 98.5 % of anchors in a batch of
  128 meet such a caption). Kept for comparison (``xmr synth --set style=v1``).

Files are written in the Karpathy split JSON format (plus per-image ``objects`` boxes and a class ``label``: the
shape of the largest object), so the real-dataset reader is the one exercised. Generation is deterministic in
the seed.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from xmr.core.errors import XmrError

SHAPES = ["circle", "square", "triangle", "star", "cross", "diamond"]
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "white": (250, 250, 250),
    "black": (20, 20, 20),
}
SIZES = {"small": (22, 34), "large": (46, 64)}


@dataclass
class SynthObject:
    shape: str
    colour: str
    size: str
    cx: float
    cy: float
    r: float

    @property
    def box(self) -> list[float]:
        return [self.cx - self.r, self.cy - self.r, self.cx + self.r, self.cy + self.r]

    def position(self, w: int) -> str:
        col = "left" if self.cx < w / 3 else "right" if self.cx > 2 * w / 3 else "middle"
        row = "top" if self.cy < w / 3 else "bottom" if self.cy > 2 * w / 3 else "centre"
        if col == "middle" and row == "centre":
            return "centre"
        if col == "middle":
            return row
        if row == "centre":
            return col
        return f"{row} {col}"

    def phrase(self, rng: random.Random, with_size: bool = True) -> str:
        parts = [self.size] if with_size and rng.random() < 0.7 else []
        return " ".join(parts + [self.colour, self.shape])


def _relation(a: SynthObject, b: SynthObject) -> str:
    dx, dy = b.cx - a.cx, b.cy - a.cy
    if abs(dx) >= abs(dy):
        return "to the left of" if dx > 0 else "to the right of"
    return "above" if dy > 0 else "below"


def _place(rng: random.Random, w: int, n: int, sizes: dict = SIZES, scale: float = 1.0, margin: float = 4,
           gap: float = 6, tries: int = 500, shapes: list[str] = SHAPES, colours: dict = COLOURS) -> list[SynthObject]:
    """Up to ``n`` non-overlapping objects (fewer when ``tries`` run out). Diameters are drawn from ``sizes`` times
    ``scale`` (v1: pixels, scale 1; v2: fractions of the image side, scale ``w``)."""
    objs: list[SynthObject] = []
    tried = 0
    while len(objs) < n and tried < tries:
        tried += 1
        size = rng.choice(list(sizes))
        r = rng.uniform(*sizes[size]) * scale / 2
        cx, cy = rng.uniform(r + margin, w - r - margin), rng.uniform(r + margin, w - r - margin)
        if any(math.hypot(cx - o.cx, cy - o.cy) < r + o.r + gap for o in objs):
            continue
        # distinct (shape, colour) pairs keep captions unambiguous about which object they mean
        while True:
            shape, colour = rng.choice(shapes), rng.choice(list(colours))
            if all((o.shape, o.colour) != (shape, colour) for o in objs):
                break
        objs.append(SynthObject(shape, colour, size, cx, cy, r))
    return objs


def _background(w: int, rng: random.Random) -> tuple[tuple[int, ...], list[tuple[list[float], tuple, int]]]:
    """The random part of an image: its base colour and clutter lines (``rng`` drawn in the order the scenes were
    always drawn, so that rendering can happen later and elsewhere: :func:`_render`)."""
    base = tuple(rng.randint(150, 205) for _ in range(3))
    lines = []
    for _ in range(rng.randint(3, 8)):  # background clutter so features are not trivially separable
        x, y = rng.uniform(0, w), rng.uniform(0, w)
        shade = tuple(min(255, max(0, c + rng.randint(-25, 25))) for c in base)
        end = [x + rng.uniform(-60, 60), y + rng.uniform(-60, 60)]
        lines.append(([x, y, *end], shade, rng.randint(1, 3)))
    return base, lines


def _render(objs: list[SynthObject], w: int, base: tuple[int, ...], lines: list[tuple[list[float], tuple, int]]):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (w, w), base)
    d = ImageDraw.Draw(img)
    for xy, shade, width in lines:
        d.line(xy, fill=shade, width=width)
    for o in objs:
        c, (x0, y0, x1, y1) = COLOURS_V2[o.colour], o.box
        if o.shape == "circle":
            d.ellipse([x0, y0, x1, y1], fill=c)
        elif o.shape == "square":
            d.rectangle([x0, y0, x1, y1], fill=c)
        elif o.shape == "triangle":
            d.polygon([(o.cx, y0), (x1, y1), (x0, y1)], fill=c)
        elif o.shape == "diamond":
            d.polygon([(o.cx, y0), (x1, o.cy), (o.cx, y1), (x0, o.cy)], fill=c)
        elif o.shape == "cross":
            t = o.r / 3
            d.rectangle([o.cx - t, y0, o.cx + t, y1], fill=c)
            d.rectangle([x0, o.cy - t, x1, o.cy + t], fill=c)
        elif o.shape == "ring":
            d.ellipse([x0, y0, x1, y1], fill=c)
            h = o.r * 0.5
            d.ellipse([o.cx - h, o.cy - h, o.cx + h, o.cy + h], fill=base)
        elif o.shape == "crescent":
            d.ellipse([x0, y0, x1, y1], fill=c)
            h = o.r * 0.8
            d.ellipse([o.cx + 0.45 * o.r - h, o.cy - h, o.cx + 0.45 * o.r + h, o.cy + h], fill=base)
        elif o.shape == "bar":
            d.rectangle([x0, o.cy - o.r * 0.3, x1, o.cy + o.r * 0.3], fill=c)
        elif o.shape == "hexagon":
            d.polygon([(o.cx + o.r * math.cos(k * math.pi / 3), o.cy + o.r * math.sin(k * math.pi / 3))
                       for k in range(6)], fill=c)
        else:  # star
            pts = []
            for k in range(10):
                rad = o.r if k % 2 == 0 else o.r * 0.45
                a = -math.pi / 2 + k * math.pi / 5
                pts.append((o.cx + rad * math.cos(a), o.cy + rad * math.sin(a)))
            d.polygon(pts, fill=c)
    return img


def _captions(objs: list[SynthObject], w: int, rng: random.Random, n: int) -> list[str]:
    """n captions, each about a different part of the scene (rotating over objects, pairs and a summary)."""
    single = [
        "a {p} in the {pos}",
        "there is a {p} at the {pos} of the picture",
        "a {p} on a plain background",
        "the {pos} shows a {p}",
    ]
    pair = ["a {a} {rel} a {b}", "a {b} with a {a} {rel}"]
    counts = {2: "two", 3: "three", 4: "four"}
    order = list(range(len(objs)))
    rng.shuffle(order)
    pairs = [(i, j) for i in range(len(objs)) for j in range(len(objs)) if i != j]
    rng.shuffle(pairs)
    caps: list[str] = []
    k = 0
    while len(caps) < n:
        kind = k % 3
        if kind == 0 or len(objs) < 2:
            o = objs[order[(k // 3) % len(objs)]]
            caps.append(rng.choice(single).format(p=o.phrase(rng), pos=o.position(w)))
        elif kind == 1:
            i, j = pairs[(k // 3) % len(pairs)]
            a, b = objs[i], objs[j]
            rel = _relation(a, b)
            t = rng.choice(pair)
            rel_b = {"to the left of": "to its left", "to the right of": "to its right",
                     "above": "above it", "below": "below it"}[rel]
            caps.append(t.format(a=a.phrase(rng, False), b=b.phrase(rng, False), rel=rel if t == pair[0] else rel_b))
        else:
            o = objs[order[(k // 3 + 1) % len(objs)]]
            caps.append(f"{counts[len(objs)]} shapes including a {o.phrase(rng, False)}")
        k += 1
    return caps


# ---------------------------------------------------------------------------------------------- style v2
SHAPES_V2 = SHAPES + ["ring", "hexagon", "crescent", "bar"]
COLOURS_V2 = dict(COLOURS)
#: object diameter as a fraction of the image side (two sizes, far apart: size must be visible in a 4 x 4 grid)
SIZES_V2 = {"small": (0.15, 0.19), "large": (0.28, 0.34)}
COUNTS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
CELLS = [["top left", "top", "top right"], ["left", "centre", "right"], ["bottom left", "bottom", "bottom right"]]
WHERE = {"top left": "in the top left corner", "top": "at the top", "top right": "in the top right corner",
         "left": "on the left", "centre": "in the centre", "right": "on the right",
         "bottom left": "in the bottom left corner", "bottom": "at the bottom",
         "bottom right": "in the bottom right corner"}
REL_B = {"to the left of": "to its left", "to the right of": "to its right", "above": "above it", "below": "below it"}
#: images with at least this many objects (and their one-small-object captions) form the ``ambiguous`` subset
AMBIGUOUS_MIN_OBJECTS = 5
#: caption kinds of an image, in order (cycled when there are more captions); ``single`` only in images with
#: AMBIGUOUS_MIN_OBJECTS or more objects (a triple otherwise)
CAPTION_PLAN = ["triple", "pair", "triple", "single", "triple"]


def cell_of(cx: float, cy: float, w: float) -> str:
    """The 3 x 3 cell of a point: 'top left' ... 'bottom right'."""
    return CELLS[min(2, int(3 * cy / w))][min(2, int(3 * cx / w))]


def relation_of(a: tuple[float, float], b: tuple[float, float]) -> str:
    """Where centre ``a`` is relative to centre ``b``, along the axis of the larger offset."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    if abs(dx) >= abs(dy):
        return "to the left of" if dx > 0 else "to the right of"
    return "above" if dy > 0 else "below"


def _phrase_v2(o: SynthObject) -> str:
    return f"{o.size} {o.colour} {o.shape}"


def _sem_object(o: SynthObject, where: str | None = None) -> dict:
    d = {"shape": o.shape, "colour": o.colour, "size": o.size}
    if where:
        d["where"] = where
    return d


def _captions_v2(objs: list[SynthObject], w: int, rng: random.Random, n: int) -> list[tuple[str, dict, bool]]:
    """n (caption, semantics, ambiguous) triples, each about a different part of the scene: three objects by
    colour and shape; two objects with sizes and their spatial relation; or (in scenes of 5+ objects) one small
    object with its place in the frame and the number of objects."""
    mentions = [0] * len(objs)
    centre = [(o.cx, o.cy) for o in objs]
    used: set[frozenset] = set()
    out: list[tuple[str, dict, bool]] = []
    for k in range(n):
        kind = CAPTION_PLAN[k % len(CAPTION_PLAN)]
        if kind == "single" and len(objs) < AMBIGUOUS_MIN_OBJECTS:
            kind = "triple"
        if kind == "triple" and len(objs) < 3:  # a crowded small image may hold fewer objects than drawn
            kind = "pair"
        if kind == "pair" and len(objs) < 2:
            kind = "single"
        jitter = [rng.random() for _ in objs]  # random tie-break among equally mentioned objects

        def load(group):  # prefer parts not described yet, then objects mentioned least
            return (frozenset(group) in used, sum(mentions[i] for i in group), sum(jitter[i] for i in group))

        amb = False
        if kind == "pair":
            def clear(p):  # a relation that is plain to see: one axis offset well above the other
                dx, dy = abs(centre[p[0]][0] - centre[p[1]][0]), abs(centre[p[0]][1] - centre[p[1]][1])
                return max(dx, dy) >= 1.5 * min(dx, dy)
            pairs = [(i, j) for i in range(len(objs)) for j in range(len(objs)) if i != j]
            named = list(min(pairs, key=lambda p: (load(p)[0], not clear(p), *load(p)[1:])))
            a, b = objs[named[0]], objs[named[1]]
            rel = relation_of(centre[named[0]], centre[named[1]])
            t = rng.randrange(3)
            if t == 0:
                text = f"a {_phrase_v2(a)} {rel} a {_phrase_v2(b)}"
            elif t == 1:
                text = f"there is a {_phrase_v2(a)} {rel} a {_phrase_v2(b)}"
            else:
                text = f"a {_phrase_v2(b)} with a {_phrase_v2(a)} {REL_B[rel]}"
            sem = {"objects": [_sem_object(a), _sem_object(b)], "relations": [[0, rel, 1]]}
        elif kind == "triple":
            from itertools import combinations

            named = list(min(combinations(range(len(objs)), 3), key=load))
            rng.shuffle(named)
            a, b, c = (objs[i] for i in named)
            lead = rng.choice(["a", "a picture of a", "shapes: a"])
            text = f"{lead} {a.colour} {a.shape}, a {b.colour} {b.shape} and a {c.colour} {c.shape}"
            sem = {"objects": [{"shape": o.shape, "colour": o.colour} for o in (a, b, c)], "relations": []}
        else:  # one small object (the least mentioned), with its place and the number of objects
            small = [i for i, o in enumerate(objs) if o.size == "small"] or list(range(len(objs)))
            i = min(small, key=lambda i: load([i]))
            named = [i]
            o, where = objs[i], cell_of(objs[i].cx, objs[i].cy, w)
            count = COUNTS[len(objs)]
            if rng.random() < 0.5:
                text = f"a {_phrase_v2(o)} {WHERE[where]} of a scene with {count} shapes"
            else:
                text = f"{count} shapes, one of them a {_phrase_v2(o)} {WHERE[where]}"
            sem = {"objects": [_sem_object(o, where)], "relations": [], "count": len(objs)}
            amb = o.size == "small"
        used.add(frozenset(named))
        for i in named:
            mentions[i] += 1
        out.append((text, sem, amb))
    return out


def caption_true_of(sem: dict, objects: list[dict], image_size: float) -> bool:
    """Whether a caption's meaning holds in an image: every object it names (shape, colour, size, cell) is there,
    as distinct objects, with the relations it states, and the object count if it gives one.

    ``objects``: the image's ``objects`` entries (``shape``, ``colour``, ``size``, ``box``)."""
    if "count" in sem and sem["count"] != len(objects):
        return False
    named = sem["objects"]

    def fits(spec: dict, o: dict) -> bool:
        if any(spec[k] != o.get(k) for k in ("shape", "colour", "size") if k in spec):
            return False
        if "where" in spec:
            x0, y0, x1, y1 = o["box"]
            return cell_of((x0 + x1) / 2, (y0 + y1) / 2, image_size) == spec["where"]
        return True

    candidates = [[k for k, o in enumerate(objects) if fits(spec, o)] for spec in named]
    if any(not c for c in candidates):
        return False

    def centre(k: int) -> tuple[float, float]:
        x0, y0, x1, y1 = objects[k]["box"]
        return (x0 + x1) / 2, (y0 + y1) / 2

    def assign(idx: int, chosen: list[int]) -> bool:
        if idx == len(named):
            return all(relation_of(centre(chosen[a]), centre(chosen[b])) == rel for a, rel, b in sem["relations"])
        return any(assign(idx + 1, chosen + [k]) for k in candidates[idx] if k not in chosen)

    return assign(0, [])


def scene_positives(entries: list[dict], image_size: float) -> list[list[list[int]]]:
    """For each image entry of a split and each of its sentences, the ``imgid`` of every *other* image of the
    split the sentence is true of (:func:`caption_true_of` on the scene records): its extended positives.

    Pruned so that generation stays cheap: only images holding an object of every (shape, colour) the caption names,
    and with its object count if it gives one, are checked."""
    holding: dict[tuple[str, str], set[int]] = {}
    by_count: dict[int, set[int]] = {}
    for k, e in enumerate(entries):
        by_count.setdefault(len(e["objects"]), set()).add(k)
        for o in e["objects"]:
            holding.setdefault((o["shape"], o["colour"]), set()).add(k)
    everyone = set(range(len(entries)))
    out = []
    for k, e in enumerate(entries):
        per_sentence = []
        for sent in e["sentences"]:
            sem = sent.get("semantics")
            if sem is None:  # v1 captions carry no meaning to check
                per_sentence.append([])
                continue
            cand = set(by_count.get(sem["count"], set())) if "count" in sem else set(everyone)
            for spec in sem["objects"]:
                if "shape" in spec and "colour" in spec:
                    cand &= holding.get((spec["shape"], spec["colour"]), set())
            cand.discard(k)
            per_sentence.append(sorted(entries[i]["imgid"] for i in cand
                                       if caption_true_of(sem, entries[i]["objects"], image_size)))
        out.append(per_sentence)
    return out


_V1_OBJECT = re.compile(r"\b(" + "|".join(COLOURS_V2) + r") (" + "|".join(SHAPES_V2) + r")s?\b")


def _semantics_of(sentence: dict) -> dict:
    """A sentence's meaning: stored (v2), else the (colour, shape) pairs its text names (v1 captions: position and
    size ignored, as in the check that measured v1's 98.5 %)."""
    if "semantics" in sentence:
        return sentence["semantics"]
    objs = [{"colour": c, "shape": s} for c, s in _V1_OBJECT.findall(sentence["raw"])]
    return {"objects": objs, "relations": []}


def synth_stats(annotations: str | os.PathLike, batch_size: int = 128, batches: int = 200, split: str = "train",
                seed: int = 0) -> dict:
    """Statistics of a synth dataset file (``xmr synth --stats``).

    ``false_negative_rate_b{batch_size}``: over ``batches`` random batches of ``batch_size`` training pairs
    (image + one of its captions, distinct images), the fraction of anchors (images) for which another pair's
    caption is true of them (:func:`caption_true_of`). Also objects per image, caption length, vocabulary, verbatim
    duplicate captions and the size of the ``ambiguous`` subset per split."""
    import numpy as np

    path = Path(annotations)
    if not path.exists():
        raise XmrError(f"{path}: not found; generate it with `xmr synth` (or `snakemake -c2 {path}`)")
    try:
        doc = json.loads(path.read_text())
        images = doc["images"]
    except (json.JSONDecodeError, KeyError, TypeError):
        raise XmrError(f"{path}: not a synth dataset file (Karpathy JSON with an 'images' list)") from None
    if not images or "objects" not in images[0]:
        raise XmrError(f"{path}: images have no 'objects' entries; statistics need a synth dataset file")
    size = float(doc.get("image_size", 224))
    pool = [im for im in images if im["split"] == split]
    if len(pool) < batch_size:
        raise XmrError(f"{path}: split {split!r} has {len(pool)} images, fewer than one batch of {batch_size}")
    rng = random.Random(seed)
    sems = [[_semantics_of(s) for s in im["sentences"]] for im in pool]
    anchors_hit = anchors = fn_total = 0
    for _ in range(batches):
        idx = rng.sample(range(len(pool)), batch_size)
        caps = [(i, rng.randrange(len(sems[i]))) for i in idx]
        for i in idx:
            hits = sum(caption_true_of(sems[j][c], pool[i]["objects"], size) for j, c in caps if j != i)
            anchors += 1
            anchors_hit += hits > 0
            fn_total += hits
    raws = [s["raw"] for im in images for s in im["sentences"]]
    lengths = np.asarray([len(r.split()) for r in raws])
    n_obj = np.asarray([len(im["objects"]) for im in images])
    counts: dict[str, int] = {}
    for r in raws:
        counts[r] = counts.get(r, 0) + 1
    splits: dict[str, dict] = {}
    for im in images:
        sp = splits.setdefault(im["split"], {"images": 0, "captions": 0, "ambiguous_images": 0,
                                             "ambiguous_captions": 0})
        sp["images"] += 1
        sp["captions"] += len(im["sentences"])
        sp["ambiguous_images"] += "ambiguous" in im.get("subsets", [])
        sp["ambiguous_captions"] += sum("ambiguous" in s.get("subsets", []) for s in im["sentences"])
    return {
        "file": str(path),
        "style": doc.get("style", "v1"),
        "seed": doc.get("seed"),
        "splits": splits,
        f"false_negative_rate_b{batch_size}": round(anchors_hit / anchors, 4),
        f"false_negatives_per_anchor_b{batch_size}": round(fn_total / anchors, 3),
        "false_negative_batches": batches,
        "objects_per_image": {"mean": round(float(n_obj.mean()), 3), "min": int(n_obj.min()),
                              "max": int(n_obj.max()),
                              "histogram": {str(k): int((n_obj == k).sum()) for k in sorted(set(n_obj.tolist()))}},
        "caption_length": {"mean": round(float(lengths.mean()), 2), "min": int(lengths.min()),
                           "max": int(lengths.max())},
        "vocabulary_size": len({t for r in raws for t in r.replace(",", " ").split()}),
        "duplicate_caption_fraction": round(sum(c for c in counts.values() if c > 1) / len(raws), 4),
    }


# ---------------------------------------------------------------------------------------------- generation
def _render_and_save(folder: Path, image_size: int, scenes: list) -> None:
    for fname, objs, base, lines in scenes:
        # lossless at any level; zlib level 1 encodes ~1.5x faster than PIL's default 6 (files ~1.3x larger)
        _render(objs, image_size, base, lines).save(folder / fname, compress_level=1)


class _Renderer:
    """Renders and saves the scenes :func:`generate_synth` draws: here (one worker) or in ``workers`` forked
    processes, a chunk of scenes at a time; leaving its ``with`` block waits for every file (a worker's error is
    raised there)."""

    CHUNK = 64

    def __init__(self, folder: Path, image_size: int, workers: int) -> None:
        self.folder, self.image_size, self.scenes, self.pending = folder, image_size, [], []
        self.pool = None
        if workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))

    def add(self, fname: str, objs: list[SynthObject], base: tuple[int, ...], lines: list) -> None:
        self.scenes.append((fname, objs, base, lines))
        if len(self.scenes) == self.CHUNK or self.pool is None:
            self._flush()

    def _flush(self) -> None:
        if self.pool is None:
            _render_and_save(self.folder, self.image_size, self.scenes)
        elif self.scenes:
            self.pending.append(self.pool.submit(_render_and_save, self.folder, self.image_size, self.scenes))
        self.scenes = []

    def __enter__(self) -> "_Renderer":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        try:
            if exc_type is None:  # every file written, or a worker's error raised here
                self._flush()
                for job in self.pending:
                    job.result()
        finally:
            if self.pool is not None:
                self.pool.shutdown(cancel_futures=True)


def generate_synth(out: str | Path, seed: int = 0, n_train: int = 2000, n_val: int = 250, n_test: int = 250,
                   captions_per_image: int = 5, image_size: int = 224, style: str = "v2",
                   min_objects: int = 3, max_objects: int = 5, progress: bool = True, workers: int = 1,
                   test_seed: int | None = None) -> Path:
    """Write ``out/dataset_synth.json`` and ``out/images/*.png``; return the JSON path. Atomic: the folder
    appears complete or not at all. ``min_objects``/``max_objects`` apply to style v2 (v1 draws 2-4).
    ``workers`` > 1 renders and encodes the images in that many processes while this one draws the scenes and
    captions from the seed: the same files, byte for byte. ``test_seed`` draws the test split's scenes from a seed
    of their own (train and val unchanged); None draws them after val's from ``seed``."""
    from tqdm import tqdm

    out = Path(out)
    if min(n_train, n_val, n_test) < 1 or captions_per_image < 1 or image_size < 64:
        raise XmrError("synth: sizes must be >= 1 image per split, >= 1 caption, image_size >= 64")
    if style not in ("v1", "v2"):
        raise XmrError(f"synth: style {style!r}; choose v1 or v2")
    if not 3 <= min_objects <= max_objects <= 6:
        raise XmrError(f"synth: need 3 <= min_objects <= max_objects <= 6, got {min_objects}, {max_objects}")
    if workers < 1:
        raise XmrError(f"synth: workers {workers}; give 1 or more processes")
    tmp = out.with_name(f".{out.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "images").mkdir(parents=True)
    main_rng = random.Random(seed)
    test_rng = random.Random(test_seed) if test_seed is not None else main_rng
    images = []
    splits = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    sentid = 0
    shapes = SHAPES if style == "v1" else SHAPES_V2
    with _Renderer(tmp / "images", image_size, workers) as renderer:
        for imgid, split in enumerate(tqdm(splits, desc="synth", unit="img", disable=not progress)):
            rng = test_rng if split == "test" else main_rng
            if style == "v1":
                objs = _place(rng, image_size, rng.randint(2, 4))
            else:
                objs = _place(rng, image_size, rng.randint(min_objects, max_objects), SIZES_V2, image_size, 2,
                              0.03 * image_size, 2000, SHAPES_V2, COLOURS_V2)
            fname = f"synth_{imgid:06d}.png"
            renderer.add(fname, objs, *_background(image_size, rng))
            if style == "v1":
                caps = [(c, None, False) for c in _captions(objs, image_size, rng, captions_per_image)]
            else:
                caps = _captions_v2(objs, image_size, rng, captions_per_image)
            largest = max(objs, key=lambda o: o.r)
            sentences = []
            for i, (c, sem, amb) in enumerate(caps):
                s = {"raw": c, "tokens": c.replace(",", " ,").split(), "imgid": imgid, "sentid": sentid + i}
                if sem is not None:
                    s["semantics"] = sem
                if amb:
                    s["subsets"] = ["ambiguous"]
                sentences.append(s)
            entry = {
                "filename": fname,
                "imgid": imgid,
                "split": split,
                "label": shapes.index(largest.shape),
                "sentids": list(range(sentid, sentid + len(caps))),
                "sentences": sentences,
                "objects": [
                    {"shape": o.shape, "colour": o.colour, "size": o.size, "box": [round(v, 2) for v in o.box]}
                    for o in objs
                ],
            }
            if style == "v2" and len(objs) >= AMBIGUOUS_MIN_OBJECTS:
                entry["subsets"] = ["ambiguous"]
            images.append(entry)
            sentid += len(caps)
    for split in ("val", "test"):  # extended positives of the evaluated splits (docs/evaluation.md)
        entries = [e for e in images if e["split"] == split]
        for e, lists in zip(entries, scene_positives(entries, image_size)):
            for sent, others in zip(e["sentences"], lists):
                sent["positives"] = others  # [] too: checked, true of no other image
    doc = {"dataset": "synth", "style": style, "seed": seed, "image_size": image_size, "label_names": shapes,
           "images": images, **({"test_seed": test_seed} if test_seed is not None else {})}
    (tmp / "dataset_synth.json").write_text(json.dumps(doc))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out / "dataset_synth.json"
