"""Where ``make test`` spends its CPU: each Python process's CPU time, grouped by what it runs (not a test; figures
go to docs/speed.md "`make test`", "Where the CPU goes"):

    python3 benchmarks/bench_test_cpu.py [--clone DIR] [--keep] [--json out.json]
    python3 benchmarks/bench_test_cpu.py --log cpu_by_process.tsv      # the table of a log already written

Without ``--clone`` it clones HEAD and makes its ``.venv/`` (as benchmarks/bench_demo.py does); ``--clone DIR`` uses a
clone whose ``.venv/`` exists. A ``sitecustomize.py`` put into that ``.venv/``'s site-packages for the run (and
removed after it) appends one line per Python process of the venv as it exits: its CPU seconds (user + system,
children not included), wall seconds since its interpreter started, and its command line. The log is read into
one row per kind of process (the pytest workers, each ``xmr`` subcommand, Snakemake, DVC, ...). Processes killed by
a signal and multiprocessing's children (which leave through ``os._exit``) write no line: the total is a lower
bound. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_demo import cpu, fresh_clone  # noqa: E402 - the one way a benchmark makes a fresh clone

MARK = "# written by benchmarks/bench_test_cpu.py"
WORKER = "<pytest-xdist worker>"  # what the log says instead of a worker's argv
SITECUSTOMIZE = MARK + '''
import atexit, json, os, sys, time
_T0 = time.monotonic()
WORKER = {worker!r}


def _argv():  # pytest-xdist's workers run code read from stdin: `python -c` with no arguments, xdist imported
    return [WORKER] if sys.argv == ["-c"] and "xdist" in sys.modules else sys.argv


def _xmr_cpu_log():
    try:
        t = os.times()
        with open({log!r}, "a") as f:  # one short write per process: lines from concurrent processes stay whole
            f.write(f"{{t.user + t.system:.2f}}\\t{{time.monotonic() - _T0:.2f}}\\t{{json.dumps(_argv())}}\\n")
    except Exception:
        pass


atexit.register(_xmr_cpu_log)
'''


def sitecustomize(log: Path) -> str:
    """The ``sitecustomize.py`` that appends each exiting process's line to ``log``."""
    return SITECUSTOMIZE.format(log=str(log), worker=WORKER)


def kind(argv: list[str]) -> str:
    """What a process ran, from its logged ``sys.argv``: ``xmr train``, ``snakemake``, ``pytest-xdist worker``, ..."""
    prog = argv[0] if argv else ""
    name = Path(prog).parent.name if prog.endswith("/__main__.py") else Path(prog).name  # `python -m NAME`
    if prog == WORKER:
        return "pytest-xdist worker"
    if name == "xmr":
        return f"xmr {argv[1]}" if len(argv) > 1 and not argv[1].startswith("-") else "xmr"
    if prog.endswith("torch/distributed/run.py"):
        return "torchrun"
    if name in ("pytest", "py.test"):
        return "pytest"
    if prog == "-c":
        return "python -c"
    if name in ("snakemake", "dvc", "mlflow"):
        return name
    if "benchmarks/" in prog:
        return "benchmarks/ scripts"
    return "other"


def read_log(text: str) -> list[dict]:
    """The log's lines as {cpu_s, wall_s, argv} (a line cut short by a crash is skipped)."""
    rows = []
    for line in text.splitlines():
        parts = line.split("\t", 2)
        try:
            rows.append({"cpu_s": float(parts[0]), "wall_s": float(parts[1]), "argv": json.loads(parts[2])})
        except (IndexError, ValueError):
            continue
    return rows


def by_kind(rows: list[dict]) -> list[dict]:
    """One row per kind of process, most CPU first: processes, CPU seconds in all and per process, share."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[kind(r["argv"])].append(r["cpu_s"])
    total = sum(r["cpu_s"] for r in rows) or 1.0
    out = [{"kind": k, "processes": len(v), "cpu_s": round(sum(v), 2), "cpu_s_each": round(sum(v) / len(v), 2),
            "share": round(sum(v) / total, 3)} for k, v in groups.items()]
    return sorted(out, key=lambda r: (-r["cpu_s"], r["kind"]))


def table(groups: list[dict]) -> str:
    lines = ["| processes | kind | CPU s | CPU s each | share |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {g['processes']} | {g['kind']} | {g['cpu_s']:.1f} | {g['cpu_s_each']:.2f} | "
              f"{100 * g['share']:.1f} % |" for g in groups]
    n, total = sum(g["processes"] for g in groups), sum(g["cpu_s"] for g in groups)
    return "\n".join(lines + [f"| {n} | all | {total:.1f} | | |"])


def site_packages(clone: Path) -> Path:
    """The site-packages folder of ``clone``'s ``.venv/`` (what its interpreter imports ``sitecustomize`` from)."""
    python = clone / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{clone}/.venv/bin/python: not found; make the clone's venv first (`make venv` there), or "
                         f"leave --clone out to let this script clone and make one")
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def logged_make_test(clone: Path, env: dict[str, str], log: Path) -> tuple[int, float]:
    """``make test`` in ``clone`` with the logging sitecustomize in its venv; (exit status, wall seconds)."""
    target = site_packages(clone) / "sitecustomize.py"
    if target.exists() and MARK not in target.read_text():
        raise SystemExit(f"{target}: a sitecustomize.py of its own is there; this script would replace it")
    target.write_text(sitecustomize(log))
    try:
        t0 = time.perf_counter()
        r = subprocess.run(["make", "test"], cwd=clone, env=env, stdin=subprocess.DEVNULL)
        return r.returncode, time.perf_counter() - t0
    finally:
        target.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clone", type=Path, help="a clone with its .venv/ made (default: a fresh clone of HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the fresh clone (and its ~7 GB .venv/)")
    ap.add_argument("--log", type=Path, help="read this log instead of running make test")
    ap.add_argument("--json", type=Path, help="write the groups (and the machine) here too")
    args = ap.parse_args(argv)
    machine, run = cpu(), {}
    if args.log:
        if not args.log.is_file():
            ap.error(f"--log {args.log}: no such file")
        text = args.log.read_text()
    else:
        log = Path(tempfile.mkdtemp(prefix="xmr-test-cpu-")) / "cpu_by_process.tsv"
        if args.clone:
            status, wall = logged_make_test(args.clone.resolve(), {k: v for k, v in os.environ.items()
                                                                   if k != "PYTHONPATH"} | {"CI": "true"}, log)
        else:
            with fresh_clone(args.keep, prefix="xmr-bench-test-cpu-") as (clone, env, venv_s):
                print(f"make venv: {venv_s:.0f} s", flush=True)
                run["make_venv_s"] = round(venv_s, 1)
                status, wall = logged_make_test(clone, env, log)
        text = log.read_text() if log.exists() else ""
        run |= {"make_test_exit": status, "make_test_wall_s": round(wall, 1), "log": str(log)}
        print(f"make test: exit {status}, {wall / 60:.1f} min; the log: {log}")
    groups = by_kind(read_log(text))
    print(f"machine: {machine['model']}, {machine['cores']} cores, AVX-512 {machine['avx512f']}, "
          f"AVX2 {machine['avx2']}")
    print(table(groups))
    if args.json:
        tmp = args.json.with_suffix(args.json.suffix + ".tmp")
        tmp.write_text(json.dumps({"machine": machine, **run, "groups": groups}, indent=1))
        tmp.replace(args.json)
    return 1 if run.get("make_test_exit") else 0


if __name__ == "__main__":
    sys.exit(main())
