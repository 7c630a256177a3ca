"""COCO-shape rehearsal of the training data path (not a test; figures go to docs/speed.md "COCO-scale").

Writes (or reuses) a ``coco_rehearsal.py`` folder at ``--scale`` and measures, through xmr's own reader and
loader (``load_split`` on the Karpathy JSON, ``FeatureFile``, ``PairDataset`` + ``PairCollate`` in a shuffled
``DataLoader``, batch 128, as the trainer builds it):

- annotation read time of the three splits;
- feature-store open time, streamed from HDF5 (``in_memory=False``: what a store larger than 4 GiB gets) and
  loaded into RAM (``in_memory=True``);
- shuffled random-batch read throughput (samples/s) per mode and DataLoader worker count; the text side is a
  no-op collate, so this is the image-feature path alone;
- the same with the per-image reads the loader made before it read whole batches (``--per-item``: the "before"
  figure of that change, in the same run);
- peak RSS of the process and of its reaped worker processes (``getrusage`` maxima);
- one epoch at full COCO size (566,435 training captions) extrapolated from each throughput;
- the training step alone (``--step-batches``): the VSE∞ COCO recipe (``config/recipes/coco/vse_inf.yaml``:
  GPO, BiGRU, embed 1,024) through the trainer's own ``TrainStep``, on batches the loader produced (text
  collated by the model), loading excluded: samples/s, against which the loader's rate is compared;
- the 5K evaluation (``--eval``): encode the test split's 5,000 images and 25,000 captions with that model from
  the store, the similarity matrix, ``evaluate_sims`` under ``coco5k``, plain and with FR, each timed. The test
  split is written at COCO's full 5,000 images whatever ``--scale`` (``--eval`` needs the folder written so).

The page cache is not dropped: the store was just written, so streamed reads come from RAM unless the store
exceeds it.

    .venv/bin/python benchmarks/bench_scale.py --scale 0.02 --dir /tmp/coco_rehearsal --batches 40 --json out.json
    .venv/bin/python benchmarks/bench_scale.py --scale 0.25 --dir /tmp/coco25 --per-item --step-batches 6 --eval
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

from coco_rehearsal import COCO_SPLITS, VOCAB, dataset_config, write_rehearsal  # noqa: E402

FULL_TRAIN_CAPTIONS = (COCO_SPLITS["train"] + COCO_SPLITS["restval"]) * 5
ROOT = Path(__file__).resolve().parents[1]


def no_text(captions, tokens, caption_indices, split):  # module level: picklable into workers
    return len(captions)


def rss_mb() -> dict[str, float]:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"self_peak_mb": round(own, 1), "children_peak_mb": round(children, 1)}


def loader_rate(split, feats, workers: int, batches: int, batch_size: int = 128, seed: int = 0,
                per_item: bool = False) -> dict:
    import torch
    from torch.utils.data import DataLoader

    from xmr.inference.loaders import PairCollate, PairDataset

    class PerItem(PairDataset):
        __getitems__ = None  # DataLoader then fetches item by item (the loader before batched reads)

    ds = (PerItem if per_item else PairDataset)(split, feats, 36)
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
    return {"workers": workers, "reads": "per_item" if per_item else "batched", "samples": n,
            "seconds": round(dt, 3), "samples_per_s": round(rate, 1),
            "full_epoch_min": round(FULL_TRAIN_CAPTIONS / rate / 60, 1)}


def vse_inf_model(vocab_words: list[str]):
    """The VSE∞ COCO recipe's model, optimizer and the trainer's step, on the CPU."""
    import torch

    from xmr.run.config import load_run_config
    from xmr.train.step import TrainForward, TrainStep, build_optimizer
    from xmr.inference.model import model_from_config
    from xmr.settings.run_settings import run_settings
    from xmr.core.utils import seed_everything

    cfg = load_run_config(str(ROOT / "config" / "recipes" / "coco" / "vse_inf.yaml"), [])
    seed_everything(0)
    model = model_from_config(cfg, 2048, vocab_words)
    optimizer = build_optimizer(model, cfg["optim"])
    scaler = torch.amp.GradScaler("cuda", enabled=False)
    step = TrainStep(model, TrainForward(model), optimizer, scaler, run_settings(cfg), cfg["optim"]["grad_clip"],
                     torch.device("cpu"), False, torch.float16)
    return model, cfg, step


def step_rate(split, feats, model, cfg, step, batches: int) -> dict:
    """The training step alone on ``batches`` loader batches (collected first; loading not timed)."""
    import torch
    from torch.utils.data import DataLoader

    from xmr.inference.loaders import PairCollate, PairDataset

    loader = DataLoader(PairDataset(split, feats, 36), batch_size=128, shuffle=True,
                        generator=torch.Generator().manual_seed(1), collate_fn=PairCollate(model.text.collate, "train"))
    it = iter(loader)
    data = [next(it) for _ in range(batches + 1)]
    model.train()
    epoch = int(cfg["loss"]["warmup_epochs"])  # after VSE∞'s warm-up: the hardest-negative step
    step(data[0], epoch, 0, 1000)  # warm-up step, not timed
    t0 = time.perf_counter()
    for k, batch in enumerate(data[1:], 1):
        step(batch, epoch, k, 1000)["loss"].item()
    dt = time.perf_counter() - t0
    rate = batches * 128 / dt
    return {"steps": batches, "seconds": round(dt, 2), "samples_per_s": round(rate, 1),
            "full_epoch_min": round(FULL_TRAIN_CAPTIONS / rate / 60, 1)}


def eval_5k(split, feats, model, cfg) -> dict:
    """Encode the test split from the store, score it and evaluate it, plain and with FR, each part timed."""
    import torch

    from xmr.evaluation import evaluate_sims
    from xmr.inference.model import encode_split_of
    from xmr.settings.run_settings import run_settings

    t0 = time.perf_counter()
    img, cap = encode_split_of(model, run_settings(cfg), split, feats, torch.device("cpu"))
    t_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    with torch.no_grad():
        sims = model.similarity_matrix(img, cap).float().numpy()
    t_sim = time.perf_counter() - t0
    protocol = "coco5k" if split.num_images == 5000 else "plain"
    out = {"images": split.num_images, "captions": split.num_captions, "protocol": protocol,
           "encode_s": round(t_enc, 1), "similarity_s": round(t_sim, 2)}
    for key, rerank in (("evaluate", None), ("evaluate_fr", "fr")):
        t0 = time.perf_counter()
        m = evaluate_sims(sims, protocol, 5, rerank=rerank)
        out[f"{key}_s"] = round(time.perf_counter() - t0, 2)
        out[f"{key}_rsum"] = round(m["rsum"], 1)
    out["total_s"] = round(t_enc + t_sim + out["evaluate_s"], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--dir", type=Path, required=True, help="rehearsal folder (written when absent)")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--modes", nargs="+", default=["stream", "ram"], choices=["stream", "ram"],
                    help="store modes to time (ram loads the whole train store: leave it out when it would not fit)")
    ap.add_argument("--per-item", action="store_true", help="also time the per-image reads (the old loader)")
    ap.add_argument("--step-batches", type=int, default=0, help="time the VSE∞ training step on this many batches")
    ap.add_argument("--eval", action="store_true", help="time the 5K evaluation (test split at full size)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (step and evaluation)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from xmr.data import load_split
    from xmr.features.store import FeatureFile

    report: dict = {"scale": args.scale, "cpus": os.cpu_count(), "load_avg_start": os.getloadavg(),
                    "rss_after_imports": rss_mb()}
    if not (args.dir / "features" / "test.h5").exists():
        t0 = time.perf_counter()
        report["generate"] = write_rehearsal(args.dir, args.scale, full_eval=args.eval)
        report["generate"]["total_s"] = round(time.perf_counter() - t0, 1)
    cfg = dataset_config(args.dir)
    t0 = time.perf_counter()
    splits = {s: load_split(cfg, s) for s in ("train", "val", "test")}
    report["annotations_s"] = round(time.perf_counter() - t0, 3)
    report["train_images"], report["train_captions"] = splits["train"].num_images, splits["train"].num_captions
    path = args.dir / "features" / "train.h5"
    report["store_mb"] = round(path.stat().st_size / 2**20, 1)
    report["disk_gb"] = round(sum(f.stat().st_size for f in args.dir.rglob("*") if f.is_file()) / 2**30, 2)
    report["modes"] = {}
    for mode, in_memory in (("stream", False), ("ram", True)):
        if mode not in args.modes:
            continue
        t0 = time.perf_counter()
        feats = FeatureFile(path, in_memory=in_memory)
        opened = time.perf_counter() - t0
        assert feats.image_ids == splits["train"].image_ids
        rows = [loader_rate(splits["train"], feats, w, args.batches) for w in args.workers]
        if args.per_item:
            rows += [loader_rate(splits["train"], feats, w, args.batches, per_item=True) for w in args.workers]
        report["modes"][mode] = {"open_s": round(opened, 3), "loader": rows, **rss_mb()}
        if mode == args.modes[-1] and (args.step_batches or args.eval):
            from xmr.text.vocab import SPECIALS

            model, cfg, step = vse_inf_model(SPECIALS + VOCAB)
            if args.step_batches:
                report["step"] = {**step_rate(splits["train"], feats, model, cfg, step, args.step_batches), **rss_mb()}
            if args.eval:
                if splits["test"].num_images != COCO_SPLITS["test"]:
                    raise SystemExit(f"{args.dir}: test split has {splits['test'].num_images} images; --eval needs "
                                     f"{COCO_SPLITS['test']} (write the folder anew with --eval)")
                test = FeatureFile(args.dir / "features" / "test.h5")
                report["eval_5k"] = {**eval_5k(splits["test"], test, model, cfg), **rss_mb()}
        del feats
    report["rss"] = rss_mb()
    report["load_avg_end"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
