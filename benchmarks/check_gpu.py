"""CPU vs GPU agreement of the evaluation engine (not a test: CI has no GPU; results go to docs/speed.md).

Runs GPO pooling (whose device path differs from the CPU's), every similarity measure, and every re-ranker under
the plain, coco1k, coco5k and cub protocols once on the CPU and once on ``--device``, on the same seeded inputs,
and prints the largest difference of each result.
Metrics may differ by one query's rank where float sums round differently (R@K steps are 0.1 at 1000 queries,
0.02 at 5000), hence the tolerance; an error on the device (e.g. a tensor left on the CPU) is a failure.

    python benchmarks/check_gpu.py                 # on a GPU node; exit status 1 if anything disagrees
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    return ap


if __name__ == "__main__":
    build_parser().parse_args()  # --help and usage errors answer before torch loads (seconds)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xmr.evaluation import evaluate_sims  # noqa: E402
from xmr.similarity.measures import compute_similarity, similarity_to_numpy  # noqa: E402

RERANKERS = (None, "fr", "rr", "mr", "isoftmax", "dsl", "csls", "qbnorm")
CHEAP_RERANKERS = (None, "fr", "csls")  # for the 5000 x 25000 protocols


def _flat(metrics: dict) -> list[float]:
    return [float(v) for d in ("i2t", "t2i") for v in metrics[d].values()]


def main() -> int:
    args = build_parser().parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("check_gpu: no CUDA device here; run it on a GPU node (or pass --device cpu to check the script)")
        return 2
    # float32 on both sides: cuDNN's RNNs run in TF32 by default, which alone moved GPO by 4.6e-4 on an H100
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    g = np.random.default_rng(args.seed)
    failures = 0

    def check(name: str, run, tol: float) -> None:
        nonlocal failures
        try:
            a, b = run("cpu"), run(args.device)
            a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            diff = float(np.max(np.abs(a - b)))
            rel = float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30))
        except Exception:  # noqa: BLE001 - any error on either device is what this script looks for
            failures += 1
            print(f"FAIL {name}")
            traceback.print_exc()
            return
        ok = diff <= tol
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max |cpu - {args.device}| = {diff:.3g} (relative {rel:.2g})")

    img = g.standard_normal((200, 4, 64)).astype(np.float32)
    cap = g.standard_normal((1000, 64)).astype(np.float32)
    for m in ("cosine", "max", "mean", "chamfer", "smooth_chamfer"):
        x = img[:, 0] if m == "cosine" else img
        # NumPy inputs: the CPU side is NumPy's path (NumPy in, NumPy out), the device side torch's
        check(f"similarity {m}",
              lambda dev, x=x, m=m: similarity_to_numpy(compute_similarity(x, cap, m, device=dev)), 1e-4)

    # GPO: the device path (no host read of the lengths) against the CPU's per-distinct-size path, with gradients
    from xmr.models.gpo import GPO

    torch.manual_seed(args.seed)
    gpo = GPO()
    feats, lengths = torch.randn(128, 36, 64), torch.randint(1, 37, (128,))

    def gpo_run(dev: str) -> np.ndarray:
        x = feats.to(dev).clone().requires_grad_()  # a fresh leaf: .to("cpu") would return feats itself
        out = gpo.to(dev)(x, lengths.to(dev))
        out.pow(2).sum().backward()
        return np.concatenate([out.detach().cpu().numpy().ravel(), x.grad.cpu().numpy().ravel()])

    check("gpo pooling + gradient", gpo_run, 1e-4)

    small = np.tanh(g.standard_normal((1000, 5000), dtype=np.float32) * 0.3)
    small[np.arange(1000), np.arange(1000) * 5] += 0.5  # some signal, so the metrics are not all near zero
    big = np.tanh(g.standard_normal((5000, 25000), dtype=np.float32) * 0.3)
    big[np.arange(5000), np.arange(5000) * 5] += 0.5
    labels = np.repeat(np.arange(100), 10)
    cases = [("plain", small, RERANKERS, {}), ("coco1k", big, CHEAP_RERANKERS, {}),
             ("coco5k", big, CHEAP_RERANKERS, {}),
             ("cub", small, (None,), {"image_labels": labels, "caption_labels": np.repeat(labels, 5)})]
    for proto, mat, rerankers, kw in cases:
        for rr in rerankers:
            params = {"self_bank": True} if rr == "qbnorm" else None

            def run(dev, mat=mat, proto=proto, rr=rr, params=params, kw=kw):
                sims = torch.as_tensor(mat).to(dev)
                return _flat(evaluate_sims(sims, proto, 5, rr, params, device=dev, **kw))

            check(f"{proto} {rr or 'none'}", run, 0.21)
    print(f"failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
