"""COCO-shape rehearsal of the training data path (not a test; figures go to docs/benchmarks.md "COCO-scale").

Writes (or reuses) a ``coco_rehearsal.py`` folder at ``--scale`` and measures, through xmr's own reader and
loader (``load_split`` on the Karpathy JSON, ``FeatureFile``, ``PairDataset`` + ``PairCollate`` in a shuffled
``DataLoader``, batch 128, as the trainer builds it):

- annotation read time of the three splits;
- feature-store open time, streamed from HDF5 (``in_memory=False``: what a store larger than 4 GiB gets) and
  loaded into RAM (``in_memory=True``);
- shuffled random-batch read throughput (samples/s) per mode and DataLoader worker count; the text side is a
  no-op collate, so this is the image-feature path alone;
- peak RSS of the process and of its reaped worker processes (``getrusage`` maxima);
- one epoch at full COCO size (566,435 training captions) extrapolated from each throughput.

The training step and the 5K evaluation are not timed here (see docs/benchmarks.md). The page cache is not
dropped: the store was just written, so streamed reads come from RAM unless the store exceeds it.

    .venv/bin/python benchmarks/bench_scale.py --scale 0.02 --dir /tmp/coco_rehearsal --batches 40 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coco_rehearsal import COCO_SPLITS, dataset_config, write_rehearsal  # noqa: E402

FULL_TRAIN_CAPTIONS = (COCO_SPLITS["train"] + COCO_SPLITS["restval"]) * 5


def no_text(captions, tokens, caption_indices, split):  # module level: picklable into workers
    return len(captions)


def rss_mb() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"self_peak_mb": round(own, 1), "children_peak_mb": round(children, 1)}


def loader_rate(split, feats, workers: int, batches: int, batch_size: int = 128, seed: int = 0) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from xmr.train.data import PairCollate, PairDataset

    ds = PairDataset(split, feats, 36)
    gen = torch.Generator().manual_seed(seed)
    loader = DataLoader(ds, batch_size=batch_size, shuffle=True, generator=gen, num_workers=workers,
                        collate_fn=PairCollate(no_text, "train"), drop_last=True,
                        persistent_workers=False)
    it = iter(loader)
    first = next(it)  # worker start-up and the first batch excluded from the rate
    assert first["feats"].shape[1:] == (36, 2048)
    t0, n = time.perf_counter(), 0
    for _ in range(batches):
        try:
            batch = next(it)
        except StopIteration:
            break
        n += len(batch["image_index"])
    dt = time.perf_counter() - t0
    del it
    rate = n / dt
    return {"workers": workers, "samples": n, "seconds": round(dt, 3), "samples_per_s": round(rate, 1),
            "full_epoch_min": round(FULL_TRAIN_CAPTIONS / rate / 60, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--dir", type=Path, required=True, help="rehearsal folder (written when absent)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from xmr.data import load_split
    from xmr.features.store import FeatureFile

    report: dict = {"scale": args.scale, "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(),
                    "rss_after_imports": rss_mb()}
    if not (args.dir / "features" / "test.h5").exists():
        t0 = time.perf_counter()
        report["generate"] = write_rehearsal(args.dir, args.scale)
        report["generate"]["total_s"] = round(time.perf_counter() - t0, 1)
    cfg = dataset_config(args.dir)
    t0 = time.perf_counter()
    splits = {s: load_split(cfg, s) for s in ("train", "val", "test")}
    report["annotations_s"] = round(time.perf_counter() - t0, 3)
    report["train_images"], report["train_captions"] = splits["train"].num_images, splits["train"].num_captions
    path = args.dir / "features" / "train.h5"
    report["store_mb"] = round(path.stat().st_size / 2**20, 1)
    report["modes"] = {}
    for mode, in_memory in (("stream", False), ("ram", True)):
        t0 = time.perf_counter()
        feats = FeatureFile(path, in_memory=in_memory)
        opened = time.perf_counter() - t0
        assert feats.image_ids == splits["train"].image_ids
        rows = [loader_rate(splits["train"], feats, w, args.batches) for w in args.workers]
        report["modes"][mode] = {"open_s": round(opened, 3), "loader": rows, **rss_mb()}
        del feats
    report["rss"] = rss_mb()
    report["load_avg_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
