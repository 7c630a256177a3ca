"""Benchmark of ``xmr search`` start to finish (not a test; figures go to docs/speed.md).

On a trained run (default: the demo's ``runs/synth/dvse_demo``, from ``make demo``), each a fresh process:

1. cold: the run's gallery cache removed first, so the search reads and encodes the test split (and caches it);
2. repeated: the same search again, ``--repeat`` times, reading the cache;
3. for scale, ``python -c "import torch"`` (the floor of any process that runs a model).

Wall and CPU time (the child's, from getrusage) per call. Target: a repeated search <= 3 s wall.

    .venv/bin/python benchmarks/bench_search.py [--run runs/synth/dvse_demo] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed_child(cmd: list[str]) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "output": r.stdout.strip().splitlines()}


def main(argv: list[str] | None = None) -> int:
    from xmr.run.layout import gallery_cache_file

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/synth/dvse_demo")
    ap.add_argument("--text", default="a red circle left of a square")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    search = [sys.executable, "-m", "xmr", "search", "--run", args.run, "--text", args.text, "--k", str(args.k)]
    res: dict = {"command": " ".join(["xmr", *search[3:]]), "cores": os.cpu_count(), "loadavg_start": os.getloadavg()}
    res["import_torch"] = timed_child([sys.executable, "-c", "import torch"])
    cache = ROOT / gallery_cache_file(args.run, "test")
    cache.unlink(missing_ok=True)
    res["cold"] = timed_child(search)
    res["repeated"] = [timed_child(search) for _ in range(args.repeat)]
    res["loadavg_end"] = os.getloadavg()
    assert all(r["output"] == res["cold"]["output"] for r in res["repeated"]), "cached search answered differently"
    for key in ("import_torch", "cold"):
        print(f"{key}: {res[key]['wall_s']:.2f} s wall, {res[key]['cpu_s']:.2f} s CPU")
    for r in res["repeated"]:
        print(f"repeated: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU")
    print("\n".join(res["cold"]["output"]))
    print(f"load average {res['loadavg_start']} -> {res['loadavg_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
