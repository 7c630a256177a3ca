"""Cost of the ECCV Caption and CxC protocols against COCO 5K (not a test; figures go to docs/speed.md).

One seeded 5000 x 25000 float32 matrix (standard normal scores), evaluated by ``xmr.evaluation.evaluate_sims`` under
``coco5k``, ``eccv`` and ``cxc`` (each also with ``--rerank`` when given), each the fastest of ``--repeat`` runs, in
wall and process CPU seconds. ``eccv`` and ``cxc`` include ``coco5k``'s own R@K; the ratio to ``coco5k`` is what the
extended positives add. Reading the eccv-caption package's annotations (``xmr.data.coco_positives``, once per
process, as ``xmr evaluate`` does before evaluating) is timed apart.

    .venv/bin/python benchmarks/bench_extended.py --repeat 3
    .venv/bin/python benchmarks/bench_extended.py --repeat 2 --rerank fr --json extended.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per protocol; the fastest is kept (default 3)")
    ap.add_argument("--rerank", default=None, help="also time each protocol after this re-ranker (e.g. fr)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, metavar="OUT.json", help="also write the figures here")
    return ap


def _timed(fn, repeat: int) -> tuple[float, float]:
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w, time.process_time() - c))
    return best


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np

    from xmr.evaluation import evaluate_sims
    from xmr.data.coco_positives import coco_positives

    sims = np.random.default_rng(args.seed).standard_normal((5000, 25000), dtype=np.float32)
    w, c = time.perf_counter(), time.process_time()
    positives = {p: coco_positives(p) for p in ("eccv", "cxc")}
    load = (time.perf_counter() - w, time.process_time() - c)
    rows = []
    for rerank in [None] + ([args.rerank] if args.rerank else []):
        base = None
        for protocol in ("coco5k", "eccv", "cxc"):
            wall, cpu = _timed(lambda: evaluate_sims(sims, protocol, rerank=rerank, positives=positives.get(protocol)),
                               args.repeat)
            base = base or (wall, cpu)
            rows.append({"protocol": protocol, "rerank": rerank or "none", "wall_s": round(wall, 3),
                         "cpu_s": round(cpu, 3), "wall_ratio": round(wall / base[0], 2),
                         "cpu_ratio": round(cpu / base[1], 2)})
    print(f"annotations read once: {load[0]:.2f} s wall, {load[1]:.2f} s CPU")
    print("| protocol | re-rank | wall s | CPU s | wall / coco5k | CPU / coco5k |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['protocol']} | {r['rerank']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['wall_ratio']:.2f} | "
              f"{r['cpu_ratio']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "annotations_s": load, "repeat": args.repeat,
                                               "machine": platform.processor() or platform.machine(),
                                               "load_average": os.getloadavg()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
