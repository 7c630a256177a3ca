"""Benchmark of feature extraction throughput (not a test; figures go to docs/speed.md "Feature extraction").

Measures, on the same machine, backbone and batch size:

1. the bare backbone forward pass on a ready tensor already on the device (the ceiling);
2. ``extract_features`` end to end on real JPEG files: decoding + resizing in DataLoader workers, forward,
   shard writes in a background thread, and the final HDF5 assembly (model loading excluded: the built
   backbone is passed in).

Target: (2) / (1) >= 0.8, i.e. loading, decoding and writing are overlapped with compute.
The test images are ``--image-size`` JPEGs (COCO-like 640 x 480 by default) cut from scikit-learn's two sample
photos with random crops, flips and noise, so each file decodes like a real photo.

    .venv/bin/python benchmarks/bench_extract.py                          # efficientnet_lite0, 256 images
    .venv/bin/python benchmarks/bench_extract.py --backbone resnet152_224 --allow-random-init --device cuda
    .venv/bin/python benchmarks/bench_extract.py --device cuda --decoder pil device --workers 4 8   # nvJPEG
    .venv/bin/python benchmarks/bench_extract.py --tower vit --images 64    # random ViT-B/16 patch tokens
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", default="efficientnet_lite0", help="key in config/backbones.yaml")
    ap.add_argument("--config-dir", default=str(Path(__file__).resolve().parents[1] / "config"))
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--image-size", default="640x480", help="WxH of the generated JPEGs")
    ap.add_argument("--batch-size", type=int, help="default: the backbone config's")
    ap.add_argument("--workers", type=int, nargs="+", default=[2], help="decoding processes (several: one run each)")
    ap.add_argument("--decoder", nargs="+", default=["auto"], choices=["auto", "pil", "device"],
                    help="image decoding (xmr/features/decode.py; several: one run each)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--allow-random-init", action="store_true", help="backbones without local weights: random init")
    ap.add_argument("--tower", choices=["vit", "clip_vision", "siglip_vision", "dinov2"],
                    help="instead of --backbone: a random-initialised base-size transformers tower (ViT-B/16 shape, "
                         "224 px) saved into a temporary folder, as a `transformers` backbone")
    ap.add_argument("--repeat", type=int, default=1, help="alternate forward/extract measurements this many times")
    ap.add_argument("--json", help="also write the figures here")
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and usage errors answer before torch loads (seconds)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xmr.config.loader import load_backbone_config  # noqa: E402
from xmr.core.utils import tune_cpu_allocator  # noqa: E402
from xmr.core.utils import resolve_device  # noqa: E402
from xmr.data import load_split  # noqa: E402
from xmr.features.backbones import build_backbone  # noqa: E402
from xmr.features.extract import extract_features, input_settings  # noqa: E402


def make_images(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> Path:
    """``n`` distinct JPEGs of ``size`` and a Karpathy JSON listing them (split ``test``)."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = load_sample_images().images  # two 427 x 640 RGB arrays
    (folder / "images").mkdir(parents=True, exist_ok=True)
    w, h = size
    images = []
    for i in range(n):
        src = photos[i % len(photos)]
        ch, cw = rng.integers(src.shape[0] // 2, src.shape[0] + 1), rng.integers(src.shape[1] // 2, src.shape[1] + 1)
        y, x = rng.integers(0, src.shape[0] - ch + 1), rng.integers(0, src.shape[1] - cw + 1)
        crop = src[y: y + ch, x: x + cw]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        noisy = np.clip(crop.astype(np.int16) + rng.integers(-8, 9, size=crop.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).resize((w, h), Image.BILINEAR).save(folder / "images" / f"{i:06d}.jpg", quality=90)
        images.append({"filename": f"{i:06d}.jpg", "imgid": i, "split": "test", "sentences": [{"raw": "x"}]})
    ann = folder / "bench.json"
    ann.write_text(json.dumps({"images": images}))
    return ann


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (DataLoader workers): robust to a shared machine."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def bare_forward(backbone, batch: int, size: int, n_images: int, dev: torch.device) -> tuple[float, float]:
    """(images/s, CPU ms per image) of the forward pass alone (plus the device-to-host copy extraction does)."""
    x = torch.randn(batch, 3, size, size, device=dev)
    if backbone.channels_last:  # the layout extraction runs the backbone in (xmr/features/extract.py)
        backbone, x = backbone.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    n_batches = -(-n_images // batch)
    with torch.inference_mode():
        for _ in range(2):  # warm-up (cuDNN autotune, oneDNN primitive caches)
            backbone(x)[0].float().cpu()
        sync(dev)
        t, c = time.perf_counter(), cpu_seconds()
        for _ in range(n_batches):
            backbone(x)[0].float().cpu()
        sync(dev)
    n = n_batches * batch
    return n / (time.perf_counter() - t), 1000 * (cpu_seconds() - c) / n


def decode_cpu_ms(split, cfg: dict) -> float:
    """CPU ms per image of decoding + resizing alone (what the DataLoader workers do)."""
    from xmr.features.decode import ImageFolderDataset

    from xmr.features.backbones import BACKBONES

    size, resize, max_size = input_settings(cfg, BACKBONES.get(cfg["name"]))
    ds = ImageFolderDataset(split.image_paths, size, resize, max_size)
    c = cpu_seconds()
    for i in range(len(ds)):
        ds[i]
    return 1000 * (cpu_seconds() - c) / len(ds)


def machine(dev: torch.device) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "loadavg_start": os.getloadavg()}


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = resolve_device(args.device)
    w, h = (int(v) for v in args.image_size.lower().split("x"))
    info = machine(dev)
    with tempfile.TemporaryDirectory(prefix="bench_extract_") as tmp:
        tmp = Path(tmp)
        if args.tower:
            from xmr.config.loader import validate
            from xmr.models.tiny_towers import save_tiny_tower

            folder = save_tiny_tower(args.tower, tmp / "tower", image_size=224, patch_size=16, hidden=768, layers=12,
                                     heads=12, mlp_ratio=4)
            args.backbone = f"{args.tower}_b16_random"
            cfg = validate({"name": "transformers", "key": args.backbone, "weights": str(folder),
                            "batch_size": 32}, "backbone", args.backbone)
        else:
            cfg = load_backbone_config(args.backbone, args.config_dir)
        if args.allow_random_init:
            cfg.update(allow_random_init=True, weights=None)
        batch = args.batch_size or cfg["batch_size"]
        ann = make_images(tmp / "data", args.images, (w, h))
        split = load_split({"name": "bench", "format": "karpathy", "annotations": str(ann),
                            "images": str(tmp / "data" / "images"), "captions_per_image": 1}, "test")
        backbone = build_backbone(cfg).to(dev)
        size = input_settings(cfg, backbone)[0]  # a saved image processor's size for transformers towers
        untuned = tuned = None
        if dev.type == "cpu":  # extract_features tunes glibc's allocator on CPU: measure the forward both ways
            untuned = bare_forward(backbone, batch, size, args.images, dev)
            tuned = tune_cpu_allocator()
            print(f"bare forward before tune_cpu_allocator: {untuned[0]:.1f} img/s, {untuned[1]:.1f} CPU ms/img "
                  f"(tuning applied: {tuned})")
        decode_ms = decode_cpu_ms(split, cfg)
        print(f"decode + resize: {decode_ms:.1f} CPU ms/img")
        rows = []
        for decoder in args.decoder:
            for workers in args.workers:
                for r in range(args.repeat):
                    fwd, fwd_ms = bare_forward(backbone, batch, size, args.images, dev)
                    out = tmp / f"f_{decoder}_{workers}_{r}.h5"
                    t, c = time.perf_counter(), cpu_seconds()
                    extract_features(split, {**cfg, "decoder": decoder}, out, batch_size=batch, workers=workers,
                                     dtype=cfg["dtype"], device=str(dev), progress=False, backbone=backbone)
                    ext, ext_ms = args.images / (time.perf_counter() - t), 1000 * (cpu_seconds() - c) / args.images
                    out.unlink()
                    rows.append({"decoder": decoder, "workers": workers, "forward_img_s": round(fwd, 1),
                                 "extract_img_s": round(ext, 1), "ratio": round(ext / fwd, 3),
                                 "forward_cpu_ms_img": round(fwd_ms, 2), "extract_cpu_ms_img": round(ext_ms, 2)})
                    print(f"decoder={decoder} workers={workers} run {r + 1}: forward {fwd:.1f} img/s ({fwd_ms:.1f} "
                          f"CPU ms/img), extract {ext:.1f} img/s ({ext_ms:.1f} CPU ms/img), ratio {ext / fwd:.2f}",
                          flush=True)
    info["loadavg_end"] = os.getloadavg()
    result = {"cpu_allocator_tuned": tuned,
              "forward_untuned_allocator": untuned and {"img_s": round(untuned[0], 1), "cpu_ms_img": round(untuned[1], 2)},
              "decode_cpu_ms_img": round(decode_ms, 2),
              "backbone": args.backbone, "input_size": size, "resize": cfg.get("resize"), "batch_size": batch,
              "images": args.images, "image_size": [w, h], "machine": info, "runs": rows}
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
