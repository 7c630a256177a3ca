"""What deterministic mode's NaN fill costs a training run, and that it changes no result (not a test; figures go
to docs/speed.md).

With ``train.deterministic: true`` (every recipe) torch can fill every new tensor with NaN before use
(``torch.utils.deterministic.fill_uninitialized_memory``), a guard against kernels that read memory they never
wrote. xmr turns it off (``train.fill_uninitialized_memory: false``). For each synth recipe this script trains
the same epochs with the guard on and off, in fresh processes one after the other (order alternating between
repeats), and reports the training seconds of each and whether every run's history (loss and validation
metrics) is identical.

Needs the synth features of ``make demo`` (and, for ``rrf``, the HGLMM caption features of ``make benchmark``).

    .venv/bin/python benchmarks/bench_nan_fill.py --json nan_fill.json             # every synth recipe, 1 epoch
    .venv/bin/python benchmarks/bench_nan_fill.py --recipes dvse vsepp --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("vsepp", "vse_inf", "vse_2ad", "coder", "rrf", "pvse", "pcme", "dive", "dvse")
TIMING_KEYS = ("seconds", "samples_per_s")


def train_once(recipe: str, fill: bool, epochs: int, out_dir: Path) -> dict:
    """Train ``config/recipes/synth/<recipe>.yaml`` for ``epochs`` into ``out_dir``; its train.json."""
    cmd = [sys.executable, "-m", "xmr", "train", "--config", str(ROOT / "config/recipes/synth" / f"{recipe}.yaml"),
           "--out-dir", str(out_dir), "--no-resume", "--no-progress", "--set", f"train.epochs={epochs}",
           "tracking.enabled=false", f"train.fill_uninitialized_memory={str(fill).lower()}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"bench_nan_fill: {recipe} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads((out_dir / "train.json").read_text())


def results_of(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting (order alternates); the median is kept")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()

    rows = []
    print("| recipe | fill on: training s | fill off: training s | off / on | same history |")
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            secs: dict[bool, list[float]] = {True: [], False: []}
            hists: list[list[dict]] = []  # every run's history: all must be the same
            for r in range(args.repeat):
                for fill in ((True, False) if r % 2 == 0 else (False, True)):
                    summary = train_once(recipe, fill, args.epochs, Path(tmp) / f"{recipe}_{fill}")
                    secs[fill].append(summary["train_seconds"])
                    hists.append(results_of(summary["history"]))
            on, off = statistics.median(secs[True]), statistics.median(secs[False])
            same = all(h == hists[0] for h in hists)
            rows.append({"recipe": recipe, "seconds_fill_on": on, "seconds_fill_off": off, "same_history": same,
                         "runs": secs})
            print(f"| {recipe} | {on:.1f} | {off:.1f} | {off / on:.2f} | {'yes' if same else 'NO'} |", flush=True)
    total_on, total_off = sum(r["seconds_fill_on"] for r in rows), sum(r["seconds_fill_off"] for r in rows)
    print(f"| all | {total_on:.1f} | {total_off:.1f} | {total_off / total_on:.2f} | "
          f"{'yes' if all(r['same_history'] for r in rows) else 'NO'} |")
    if args.json:
        meta = {"epochs": args.epochs, "repeat": args.repeat, "cpus": os.cpu_count(),
                "python": platform.python_version(), "machine": platform.processor() or platform.machine()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
