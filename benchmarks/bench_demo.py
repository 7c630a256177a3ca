"""``make demo`` on a fresh clone, timed by phase, its RSUMs checked against the README's table (not a test; figures
go to docs/speed.md "`make demo`"). On another kind of CPU the check is this one command:

    python3 benchmarks/bench_demo.py [--runs 1] [--keep] [--json out.json]

Each run clones this repository's HEAD into a temporary folder and runs ``make demo`` there (CI=true, stdin
closed), as a new user would. Creating ``.venv/`` is timed apart from the pipeline. The clone's Snakemake log gives
each job's start and end, and its training log gives the epochs' seconds. The CPU's model name and its AVX-512/AVX2
flags are printed with the figures. Targets: the pipeline in <= 60 s, and each RSUM within the README's cross-CPU
tolerance (8) of the README's table. Standard library only: it runs before any ``.venv/`` exists. A clone's
``.venv/`` is ~7 GB, so each clone is removed after its run unless ``--keep``.

``--kernel-sets`` re-runs the demo in the same clone (its outputs removed by ``git clean``, ``.venv/`` kept) with
torch's libraries pinned to the named instruction sets (``KERNEL_SETS``). Their RSUMs are runs of the same recipe
that differ only in floating-point rounding, the thing that moves the table from one CPU to another: their spread
measures how far apart CPUs print, though no pin reproduces a given CPU's table (docs/speed.md, "The table on
another CPU"). The pipeline's time target applies to the ``native`` set only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0
RSUM_TOLERANCE = 8.0  # the README's cross-CPU tolerance: the widest gap between the tables of 18 kernel pins (7.7; 7.3 on the earlier test split)
#: each library's instruction sets in the grid: ATen's vectorised ops (``default`` is its build without AVX), oneDNN's
#: convolutions and MKL's GEMM (``compatible`` is its generic code, which it may also take on a non-Intel CPU)
ATEN = {"avx512": "avx512", "avx2": "avx2", "default": "default"}
ONEDNN = {"avx512": "AVX512_CORE", "avx2": "AVX2"}
MKL = {"avx512": "AVX512", "avx2": "AVX2", "compatible": "COMPATIBLE"}
#: name -> environment: ``native`` is the CPU's own choice (what a user runs); the others pin each library
#: (``aten_avx2+onednn_avx2+mkl_avx2`` is ``XMR_PORTABLE_CPU=1``'s pins)
KERNEL_SETS: dict[str, dict[str, str]] = {"native": {}} | {
    f"aten_{a}+onednn_{o}+mkl_{m}": {"ATEN_CPU_CAPABILITY": ATEN[a], "ONEDNN_MAX_CPU_ISA": ONEDNN[o],
                                     "MKL_CBWR": MKL[m]}
    for a in ATEN for o in ONEDNN for m in MKL}
_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")


def job_spans(log: str) -> list[dict]:
    """Each job of a Snakemake log as {rule, jobid, start, end} (datetimes; Snakemake stamps to the second)."""
    now, jobs, opening = None, {}, None
    for line in log.splitlines():
        line = line.strip()
        if m := _STAMP.match(line):
            now = datetime.strptime(" ".join(m[1].split()), "%a %b %d %H:%M:%S %Y")
        elif m := re.match(r"^(?:local)?rule (\w+):$", line):
            opening = m[1]
        elif opening and (m := re.match(r"^jobid: (\d+)$", line)):
            jobs[int(m[1])] = {"rule": opening, "jobid": int(m[1]), "start": now, "end": None}
            opening = None
        elif m := re.match(r"^Finished jobid: (\d+)", line):
            jobs[int(m[1])]["end"] = now
    return sorted(jobs.values(), key=lambda j: (j["start"], j["jobid"]))


def phases(spans: list[dict]) -> dict[str, float]:
    """Rule -> seconds from its first job's start to its last job's end (jobs of one rule may overlap)."""
    out: dict[str, float] = {}
    for rule in dict.fromkeys(j["rule"] for j in spans):
        mine = [j for j in spans if j["rule"] == rule]
        out[rule] = (max(j["end"] for j in mine) - min(j["start"] for j in mine)).total_seconds()
    return out


def readme_rsums(readme: str) -> dict[str, float]:
    """Target -> RSUM of the README's demo table (the rows ``| synth | <target> | plain | ...``)."""
    header = next(ln for ln in readme.splitlines() if ln.startswith("| dataset | target |") and "RSUM" in ln)
    col = [c.strip() for c in header.strip("|").split("|")].index("RSUM")
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| synth |") and len(cells) > col and cells[2] == "plain":
            rows[cells[1]] = float(cells[col])
    return rows


def epoch_seconds(train_log: str) -> list[float]:
    return [float(m[1]) for m in re.finditer(r"^epoch \d+/\d+ .*seconds=([\d.]+)", train_log, flags=re.M)]


def cpu() -> dict:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, flags=re.M)
    flags = set((re.search(r"^flags\s*:\s*(.+)$", info, flags=re.M) or [None, ""])[1].split())
    return {"model": model[1] if model else "unknown", "cores": os.cpu_count(),
            "avx512f": "avx512f" in flags, "avx2": "avx2" in flags}


def demo_in(clone: Path, env: dict[str, str]) -> dict:
    """``make demo`` in ``clone`` (``.venv/`` made) with ``env``: its time by phase, epochs and RSUMs."""
    t0 = time.perf_counter()
    demo = subprocess.run(["make", "demo"], cwd=clone, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    made = [clone / "results" / "synth" / f"{t}.json" for t in ("dvse_demo", "dvse_demo_fr")]
    if demo.returncode != 0 and not all(p.exists() for p in made):  # a table off the README's is reported below
        raise SystemExit(f"make demo failed in {clone} (exit {demo.returncode}):\n{demo.stdout[-3000:]}"
                         f"{demo.stderr[-2000:]}")
    printed = re.search(r"demo finished in (\d+) s", demo.stdout)
    log = max((clone / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    results = {p.stem: json.loads(p.read_text())["rsum"] for p in made}
    return {"pipeline_s": int(printed[1]) if printed else round(wall), "phases_s": phases(job_spans(log.read_text())),
            "epochs_s": epoch_seconds((clone / "logs/train/synth_dvse_demo.log").read_text()),
            "rsum": {t: round(v, 1) for t, v in results.items()}}


@contextmanager
def fresh_clone(keep: bool, prefix: str = "xmr-bench-demo-") -> Iterator[tuple[Path, dict[str, str], float]]:
    """A clone of HEAD in a temporary folder with its ``.venv/`` made by ``make venv``, as a new user has it:
    (clone, the environment to run its commands in: CI=true, no PYTHONPATH; seconds ``make venv`` took). The clone
    is removed afterwards unless ``keep``."""
    clone = Path(tempfile.mkdtemp(prefix=prefix)) / "xmr"
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CI": "true"}
        t0 = time.perf_counter()
        venv = subprocess.run(["make", "venv"], cwd=clone, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True)  # pip's warnings are many: shown only when it fails
        if venv.returncode != 0:
            raise SystemExit(f"make venv failed in {clone} (exit {venv.returncode}):\n{venv.stderr[-3000:]}")
        yield clone, env, time.perf_counter() - t0
    finally:
        if not keep:
            shutil.rmtree(clone.parent, ignore_errors=True)


def run_once(keep: bool, kernel_sets: list[str] = ("native",)) -> dict:
    """A fresh clone, its ``.venv/`` (timed), then ``make demo`` once per kernel set (outputs removed between)."""
    with fresh_clone(keep) as (clone, env, venv_s):
        sets = {}
        for i, name in enumerate(kernel_sets):
            if i:
                subprocess.run(["git", "clean", "-fdxq", "-e", ".venv"], cwd=clone, check=True)
            sets[name] = demo_in(clone, env | KERNEL_SETS[name])
        return {"venv_s": round(venv_s, 1), "kernel_sets": sets, "clone": str(clone) if keep else None}


def spread_line(gaps: dict[str, list[float]], readme: dict[str, float]) -> str:
    """The RSUMs' spread over runs: their sample standard deviation per target, over the distinct outcomes (runs whose
    RSUMs agree to the printed digit on every target computed the same thing and count once)."""
    outcomes = sorted(set(zip(*gaps.values())))
    if len(outcomes) < 2:
        return f"one distinct outcome in {len(next(iter(gaps.values())))} runs"
    parts = []
    for i, t in enumerate(gaps):
        values = [readme[t] + o[i] for o in outcomes]
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        parts.append(f"{t} mean {mean:.1f} std {std:.2f}")
    return f"{len(outcomes)} distinct outcomes in {len(next(iter(gaps.values())))} runs: " + ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="fresh clones, one after another")
    ap.add_argument("--kernel-sets", default="native",
                    help="comma-separated names, run in this order in each clone: native (the default), "
                         "aten_{avx512,avx2,default}+onednn_{avx512,avx2}+mkl_{avx512,avx2,compatible}, or all")
    ap.add_argument("--keep", action="store_true", help="keep each clone (and its ~7 GB .venv/)")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    names = list(KERNEL_SETS) if args.kernel_sets == "all" else args.kernel_sets.split(",")
    if unknown := [n for n in names if n not in KERNEL_SETS]:
        ap.error(f"--kernel-sets: unknown {', '.join(unknown)}; see --help for the names")
    readme = readme_rsums((ROOT / "README.md").read_text())
    machine = cpu()
    print(f"machine: {machine['model']}, {machine['cores']} cores, AVX-512 {machine['avx512f']}, "
          f"AVX2 {machine['avx2']}")
    runs, ok, gaps_seen = [], True, {t: [] for t in readme}
    for i in range(args.runs):
        r = run_once(args.keep, names)
        runs.append(r)
        print(f"run {i + 1}: .venv/ {r['venv_s']} s")
        for name, d in r["kernel_sets"].items():
            phase_text = ", ".join(f"{k} {v:.0f} s" for k, v in d["phases_s"].items())
            gaps = {t: round(d["rsum"][t] - readme[t], 1) for t in d["rsum"]}
            for t, g in gaps.items():
                gaps_seen[t].append(g)
            ok &= all(abs(g) <= RSUM_TOLERANCE for g in gaps.values())
            if name == "native":
                ok &= d["pipeline_s"] <= TARGET_S
            print(f"  {name}: pipeline {d['pipeline_s']} s" + (f" (target <= {TARGET_S:.0f})" if name == "native"
                  else "") + f"; {phase_text}; epochs {' + '.join(f'{s:.1f}' for s in d['epochs_s'])} s")
            print(f"    RSUM {d['rsum']} vs README {readme}: differences {gaps} (tolerance {RSUM_TOLERANCE})")
    if sum(len(g) for g in gaps_seen.values()) > len(gaps_seen):
        print("largest |difference| from the README: " + ", ".join(
            f"{t} {max(abs(g) for g in v):.1f} (range {min(v):+.1f} to {max(v):+.1f})" for t, v in gaps_seen.items()))
        print(spread_line(gaps_seen, readme))
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps({"machine": machine, "readme_rsum": readme, "runs": runs}, indent=1, default=str))
        tmp.replace(args.json)
    print("targets met" if ok else "targets NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
