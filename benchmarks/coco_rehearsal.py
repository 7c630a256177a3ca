"""Write a COCO-shaped rehearsal dataset (synthetic content, COCO's shapes) for ``bench_scale.py``.

At ``--scale 1``: a Karpathy ``dataset_coco.json`` of 123,287 images (82,783 train + 30,504 restval + 5,000 val +
5,000 test) x 5 captions, and feature stores ``features/{train,val,test}.h5`` of 113,287 / 5,000 / 5,000 images x
36 regions x 2,048 (float16 by default: about 17 GB for train), written through xmr's own ``ShardWriter`` so
the layout is exactly what ``xmr extract`` / ``xmr import-features`` produce. ``--scale f`` writes a fraction
of every split (at least 1 image each). Captions are random words from a 2,000-word vocabulary, 8-14 words.

    .venv/bin/python benchmarks/coco_rehearsal.py --scale 0.02 --out /tmp/coco_rehearsal
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xmr.features.store import ShardWriter  # noqa: E402

COCO_SPLITS = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}
REGIONS, DIM, CAPTIONS = 36, 2048, 5
VOCAB = [f"w{i}" for i in range(2000)]


def split_sizes(scale: float, full_eval: bool = False) -> dict[str, int]:
    """Images per Karpathy split at ``scale``; ``full_eval``: val and test at COCO's 5,000 whatever the scale."""
    return {k: COCO_SPLITS[k] if full_eval and k in ("val", "test") else max(1, round(n * scale))
            for k, n in COCO_SPLITS.items()}


def dataset_config(out: Path) -> dict:
    """The dataset config of a rehearsal folder (COCO's, with its paths)."""
    return {"name": "cocorehearsal", "format": "karpathy", "root": str(out),
            "annotations": str(out / "dataset_coco.json"), "images": str(out / "images"), "captions_per_image": 5,
            "splits": {"train": ["train", "restval"], "val": ["val"], "test": ["test"]}}


def write_rehearsal(out: Path, scale: float, dtype: str = "float16", seed: int = 0, block: int = 512,
                    full_eval: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = VOCAB
    sizes = split_sizes(scale, full_eval)
    images, ids_by_split = [], {"train": [], "val": [], "test": []}
    imgid = 0
    for ksplit, n in sizes.items():
        for _ in range(n):
            cocoid = 100_000 + imgid
            folder = "val2014" if ksplit in ("val", "test", "restval") else "train2014"
            sents = []
            for _ in range(CAPTIONS):
                toks = [vocab[t] for t in rng.integers(0, len(vocab), rng.integers(8, 15))]
                sents.append({"raw": " ".join(toks) + ".", "tokens": toks})
            images.append({"filepath": folder, "filename": f"COCO_{folder}_{cocoid:012d}.jpg", "cocoid": cocoid,
                           "imgid": imgid, "split": ksplit, "sentences": sents})
            ids_by_split["train" if ksplit in ("train", "restval") else ksplit].append(str(cocoid))
            imgid += 1
    (out / "dataset_coco.json").write_text(json.dumps({"images": images}))
    np_dtype = np.float16 if dtype == "float16" else np.float32
    times = {}
    for split, ids in ids_by_split.items():
        t0 = time.perf_counter()
        path = out / "features" / f"{split}.h5"
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = ShardWriter(path, len(ids), {"backbone": "rehearsal", "dataset": "cocorehearsal", "split": split,
                                              "dtype": dtype})
        for s in range(0, len(ids), block):
            b = min(block, len(ids) - s)
            feats = rng.standard_normal((b, REGIONS, DIM), dtype=np.float32).astype(np_dtype)
            writer.write(s, feats, np.full(b, REGIONS))
        writer.finish(ids, dtype=dtype)
        times[split] = time.perf_counter() - t0
    return {"sizes": sizes, "images": {k: len(v) for k, v in ids_by_split.items()}, "write_s": times,
            "store_bytes": {k: (out / "features" / f"{k}.h5").stat().st_size for k in ids_by_split}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.25, help="fraction of COCO's size (1 = full)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    ap.add_argument("--full-eval", action="store_true", help="val and test at COCO's 5,000 images whatever --scale")
    args = ap.parse_args()
    print(json.dumps(write_rehearsal(args.out, args.scale, args.dtype, full_eval=args.full_eval), indent=1))


if __name__ == "__main__":
    main()
