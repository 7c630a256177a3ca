"""The embedded ``synth`` dataset: rendered scenes of coloured shapes with partial captions.

Each image holds 2-4 objects (shape, colour, size, position) on a textured background. Its captions each
describe a *different subset* of the scene (one object, a pair with a spatial relation, or a summary), so one
image matches semantically different captions: the ambiguity that set-based methods address. Files are
written in the Karpathy split JSON format (plus per-image ``objects`` boxes and a class ``label``: the shape of
the largest object), so the real-dataset reader is the one exercised. Generation is deterministic in the seed.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

from xmr.errors import XmrError

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


def _place(rng: random.Random, w: int, n: int) -> list[SynthObject]:
    objs: list[SynthObject] = []
    tries = 0
    while len(objs) < n and tries < 500:
        tries += 1
        size = rng.choice(list(SIZES))
        r = rng.uniform(*SIZES[size]) / 2
        cx, cy = rng.uniform(r + 4, w - r - 4), rng.uniform(r + 4, w - r - 4)
        if any(math.hypot(cx - o.cx, cy - o.cy) < r + o.r + 6 for o in objs):
            continue
        # distinct (shape, colour) pairs keep captions unambiguous about which object they mean
        while True:
            shape, colour = rng.choice(SHAPES), rng.choice(list(COLOURS))
            if all((o.shape, o.colour) != (shape, colour) for o in objs):
                break
        objs.append(SynthObject(shape, colour, size, cx, cy, r))
    return objs


def _draw(objs: list[SynthObject], w: int, rng: random.Random):
    from PIL import Image, ImageDraw

    base = tuple(rng.randint(150, 205) for _ in range(3))
    img = Image.new("RGB", (w, w), base)
    d = ImageDraw.Draw(img)
    for _ in range(rng.randint(3, 8)):  # background clutter so features are not trivially separable
        x, y = rng.uniform(0, w), rng.uniform(0, w)
        shade = tuple(min(255, max(0, c + rng.randint(-25, 25))) for c in base)
        d.line([x, y, x + rng.uniform(-60, 60), y + rng.uniform(-60, 60)], fill=shade, width=rng.randint(1, 3))
    for o in objs:
        c, (x0, y0, x1, y1) = COLOURS[o.colour], o.box
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


def generate_synth(out: str | Path, seed: int = 0, n_train: int = 2000, n_val: int = 250, n_test: int = 250,
                   captions_per_image: int = 5, image_size: int = 224, progress: bool = True) -> Path:
    """Write ``out/dataset_synth.json`` and ``out/images/*.png``; return the JSON path. Atomic: the folder
    appears complete or not at all."""
    from tqdm import tqdm

    out = Path(out)
    if min(n_train, n_val, n_test) < 1 or captions_per_image < 1 or image_size < 64:
        raise XmrError("synth: sizes must be >= 1 image per split, >= 1 caption, image_size >= 64")
    tmp = out.with_name(f".{out.name}.partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "images").mkdir(parents=True)
    rng = random.Random(seed)
    images = []
    splits = ["train"] * n_train + ["val"] * n_val + ["test"] * n_test
    sentid = 0
    for imgid, split in enumerate(tqdm(splits, desc="synth", unit="img", disable=not progress)):
        objs = _place(rng, image_size, rng.randint(2, 4))
        fname = f"synth_{imgid:06d}.png"
        _draw(objs, image_size, rng).save(tmp / "images" / fname)
        caps = _captions(objs, image_size, rng, captions_per_image)
        largest = max(objs, key=lambda o: o.r)
        images.append({
            "filename": fname,
            "imgid": imgid,
            "split": split,
            "label": SHAPES.index(largest.shape),
            "sentids": list(range(sentid, sentid + len(caps))),
            "sentences": [
                {"raw": c, "tokens": c.split(), "imgid": imgid, "sentid": sentid + i} for i, c in enumerate(caps)
            ],
            "objects": [
                {"shape": o.shape, "colour": o.colour, "size": o.size, "box": [round(v, 2) for v in o.box]}
                for o in objs
            ],
        })
        sentid += len(caps)
    doc = {"dataset": "synth", "seed": seed, "label_names": SHAPES, "images": images}
    (tmp / "dataset_synth.json").write_text(json.dumps(doc))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out / "dataset_synth.json"
