"""Benchmark of evaluation from the command line, end to end, against the bare NumPy GEMM (not a test; figures go
to docs/speed.md).

DVSE's COCO-5K shape by default: 5000 images x K=6 sub-embeddings x 1024-d against 25,000 captions x 1024-d,
max over the set, coco5k with FR (``--scale`` shrinks N and M together). The embeddings are written to .npy files
first (not timed), then, on the same files:

1. the bare NumPy float32 GEMM of all sub-embeddings against all captions ((N·K) x M output), in this process
   with the environment as given (``OPENBLAS_CORETYPE`` as set), and in a child process with OpenBLAS's own
   choice of kernels (``OPENBLAS_CORETYPE`` unset);
2. the documented CLI path, one process, start-up and file reads included:
   ``xmr evaluate --images I.npy --captions C.npy --measure max --protocol coco5k --rerank fr --out M.json``,
   with the machine's own kernels (the default) and with ``XMR_PORTABLE_CPU=1`` (the opt-in AVX2 pin);
3. with ``--two-step``, the path documented before: ``xmr similarity --out S.npy`` then
   ``xmr evaluate --sims S.npy`` (two processes, the matrix on disk);
4. torch's GEMM at the same shape with its own kernels and under the pin (what the pin costs);
5. ``--pairs N`` (default 3) interleaved pairs: NumPy's GEMM with OpenBLAS's own kernels in a fresh process,
   then the default CLI. Their median ratio is the target's verdict: a VM's speed can drift between the separate
   measurements above (on the 2-core development VM by up to 1.4x within minutes), and a pair sees the same drift.
   After each pair, torch's import timed in a fresh process: printed beside what the target leaves next to the
   GEMM (0.4 x its median), since the CLI pays that import and no change inside xmr removes it.

With ``--floor`` each pair also runs the command's computation in NumPy alone, in a fresh process that never
imports torch (unit-normalise, the GEMM in blocks, the max over K, FR with the COCO scales, pessimistic ranks,
RSUM): the floor of what a torch-free CPU path of ``xmr evaluate`` could take, for the planning decision that
the Intel figure (docs/speed.md). Its RSUM is checked against the CLI's (the same formula, computed apart).

``--only-pairs`` skips 1-4 (the short form for a time-boxed run); ``--profile`` also runs the
default CLI once under cProfile and prints its 25 costliest functions by own time.

Wall times and CPU times (the children's, from getrusage) are both reported: on a shared, loaded machine the
CPU time is the steadier measure of work done. Target: the default CLI <= 1.4x NumPy's own GEMM.

    .venv/bin/python benchmarks/bench_eval_cli.py                    # full scale: ~0.5 GB per matrix, minutes
    .venv/bin/python benchmarks/bench_eval_cli.py --scale 0.2 --two-step
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
IMPORT_TORCH = "import time; t0 = time.perf_counter(); import torch; print(time.perf_counter() - t0)"
PIN_VARS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
            "XMR_NATIVE_CPU", "XMR_PORTABLE_CPU")


def make_data(n: int, k: int, d: int, c: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm image sub-embeddings and captions near their image's mean embedding (bench_eval.py's recipe, in
    NumPy so that this process never imports torch)."""
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((n, k, d), dtype=np.float32)
    img /= np.linalg.norm(img, axis=-1, keepdims=True)
    cap = img.mean(1).repeat(c, axis=0) + np.float32(0.065) * rng.standard_normal((n * c, d), dtype=np.float32)
    cap /= np.linalg.norm(cap, axis=-1, keepdims=True)
    return img, cap


def child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, its output) of a command run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stdout + r.stderr


def gemm(lib: str, images: str, captions: str) -> dict:
    """One timed GEMM of the files' (N·K, D) x (D, M) in ``lib`` (numpy or torch), run in a child process."""
    a = np.load(images).reshape(-1, np.load(images, mmap_mode="r").shape[-1])
    b = np.load(captions)
    if lib == "torch":
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)
    t0, c0 = time.perf_counter(), time.process_time()
    out = a @ b.T
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "shape": list(out.shape)}


def floor(images: str, captions: str, c: int = 5, block_bytes: int = 128 * 2**20) -> dict:
    """RSUM of ``--measure max --rerank fr`` (gamma 25/25, lambda 20/20: the coco row and the code's defaults) with
    pessimistic ties, in NumPy alone: what the documented command computes, without torch's import."""
    x_all, cap = np.load(images), np.load(captions)
    n, k, d = x_all.shape
    m = cap.shape[0]
    norms = np.linalg.norm(cap, axis=-1, keepdims=True)
    if not (np.abs(norms - 1.0) < 1e-4).all():  # like the CLI: a unit-norm gallery is used as it is
        cap = cap / np.maximum(norms, np.float32(1e-12))
    sims = np.empty((n, m), np.float32)
    rows = max(1, block_bytes // (k * m * 4))
    buf = np.empty((min(rows, n) * k, m), np.float32)  # one element block, reused
    for r0 in range(0, n, rows):
        x = x_all[r0:r0 + rows]
        x = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), np.float32(1e-12))
        dots = buf[:x.shape[0] * k]
        np.matmul(x.reshape(-1, d), cap.T, out=dots)
        np.max(dots.reshape(x.shape[0], k, m), axis=1, out=sims[r0:r0 + x.shape[0]])
    g1 = g2 = np.float32(25.0)
    l1 = l2 = np.float32(20.0)
    hi, lo = float(sims.max()), float(sims.min())
    assert max(g1, l1) * (hi - lo) <= 80.0, "scores too spread for one shared shift"
    col, row = np.zeros(m, np.float64), np.empty(n, np.float32)
    step = max(1, block_bytes // (m * 4 * 2))
    for r0 in range(0, n, step):  # log-sum-exp over images (per caption) and over captions (per image)
        s = sims[r0:r0 + step]
        e = s * g1
        e -= g1 * np.float32(hi)
        col += np.exp(e, out=e).sum(0)
        e = s * l1
        e -= l1 * np.float32(hi)
        row[r0:r0 + step] = np.log(np.exp(e, out=e).sum(1)) + l1 * np.float32(hi)
    col = (np.log(col) + g1 * hi).astype(np.float32)
    owner = np.arange(m) // c
    t2i_gt = l2 * sims[owner, np.arange(m)] - row[owner]
    i2t, above = np.empty(n, np.int64), np.zeros(m, np.int64)
    for r0 in range(0, n, step):
        s = sims[r0:r0 + step]
        r = s * g2
        r -= col  # image -> text: each caption normalised over the images
        gt = r[np.arange(s.shape[0])[:, None], (np.arange(r0, r0 + s.shape[0])[:, None] * c + np.arange(c))]
        best = gt.max(1, keepdims=True)
        i2t[r0:r0 + s.shape[0]] = (r >= best).sum(1) - (gt == best).sum(1)
        t = s * l2
        t -= row[r0:r0 + s.shape[0], None]  # text -> image: each image normalised over the captions
        above += (t >= t2i_gt).sum(0)
    t2i = above - 1  # the ground truth counted itself
    rsum = sum(100.0 * float((ranks < top).mean()) for ranks in (i2t, t2i) for top in (1, 5, 10))
    return {"rsum": rsum}


def gemm_child(lib: str, files: list[str], env: dict[str, str]) -> dict:
    _, _, printed = child([sys.executable, __file__, "--gemm", lib, *files], env)
    return json.loads(printed.strip().splitlines()[-1])


def separate_measurements(res: dict, args: argparse.Namespace, img: np.ndarray, cap: np.ndarray, files: list[str],
                          evaluate: list[str], base: dict[str, str], protocol: str, tmp: str) -> None:
    """Measurements 1-3 (the bare GEMMs, the CLI native and pinned, the two-step path) into `res`."""
    x = img.reshape(-1, args.dim)
    t0, c0 = time.perf_counter(), time.process_time()
    out = x @ cap.T
    res["bare_numpy"] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
    del out, x
    print(f"bare numpy GEMM (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}): "
          f"{res['bare_numpy']['wall_s']:.2f} s wall, {res['bare_numpy']['cpu_s']:.2f} s CPU", flush=True)
    res["bare_numpy_openblas_default"] = gemm_child("numpy", files, base)
    print(f"bare numpy GEMM (OpenBLAS's own kernels): {res['bare_numpy_openblas_default']['wall_s']:.2f} s wall, "
          f"{res['bare_numpy_openblas_default']['cpu_s']:.2f} s CPU", flush=True)

    for key, extra in (("cli_native", {}), ("cli_pinned", {"XMR_PORTABLE_CPU": "1"})):
        wall, cpu, printed = child(evaluate, base | extra)
        own = res["bare_numpy_openblas_default"]
        res[key] = {"wall_s": wall, "cpu_s": cpu, "rsum": json.loads((Path(tmp) / "M.json").read_text())["rsum"],
                    "over_bare_wall": wall / res["bare_numpy"]["wall_s"],
                    "over_bare_cpu": cpu / res["bare_numpy"]["cpu_s"],
                    "over_openblas_default_wall": wall / own["wall_s"],
                    "over_openblas_default_cpu": cpu / own["cpu_s"]}
        print(f"{key}: {wall:.2f} s wall ({res[key]['over_bare_wall']:.2f}x bare, "
              f"{res[key]['over_openblas_default_wall']:.2f}x OpenBLAS's own), {cpu:.2f} s CPU "
              f"({res[key]['over_bare_cpu']:.2f}x, {res[key]['over_openblas_default_cpu']:.2f}x); "
              f"{printed.strip().splitlines()[-1]}", flush=True)
    if args.two_step:
        sims = str(Path(tmp) / "S.npy")
        w1, c1, _ = child([sys.executable, "-m", "xmr", "similarity", "--images", files[0], "--captions", files[1],
                           "--measure", "max", "--out", sims], base)
        w2, c2, _ = child([sys.executable, "-m", "xmr", "evaluate", "--sims", sims, "--protocol", protocol,
                           "--rerank", "fr", "--out", str(Path(tmp) / "M2.json")], base)
        res["two_step"] = {"wall_s": w1 + w2, "cpu_s": c1 + c2,
                           "over_bare_wall": (w1 + w2) / res["bare_numpy"]["wall_s"],
                           "over_bare_cpu": (c1 + c2) / res["bare_numpy"]["cpu_s"]}
        print(f"two_step: {w1 + w2:.2f} s wall ({res['two_step']['over_bare_wall']:.2f}x), "
              f"{c1 + c2:.2f} s CPU ({res['two_step']['over_bare_cpu']:.2f}x)", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of 5000 images / 25,000 captions (default 1)")
    ap.add_argument("--k", type=int, default=6, help="image sub-embeddings (default 6)")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--two-step", action="store_true", help="also time xmr similarity + xmr evaluate --sims")
    ap.add_argument("--pairs", type=int, default=3,
                    help="interleaved (NumPy's own GEMM, default CLI) pairs; their median ratio is the verdict")
    ap.add_argument("--only-pairs", action="store_true", help="skip measurements 1-4: the pairs alone")
    ap.add_argument("--profile", action="store_true",
                    help="also run the default CLI once under cProfile and print its 25 costliest functions")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--floor", action="store_true",
                    help="each pair also times the command's computation in NumPy alone (no torch): the floor")
    ap.add_argument("--floor-child", nargs=2, metavar=("I", "C"), help=argparse.SUPPRESS)
    ap.add_argument("--gemm", nargs=3, metavar=("LIB", "I", "C"), help=argparse.SUPPRESS)  # the child's job
    args = ap.parse_args(argv)
    if args.gemm:
        print(json.dumps(gemm(*args.gemm)))
        return 0
    if args.floor_child:
        print(json.dumps(floor(*args.floor_child)))
        return 0
    n = max(10, round(5000 * args.scale))
    c = 5
    protocol = "coco5k" if n == 5000 else "plain"
    res: dict = {"shape": {"images": n, "K": args.k, "dim": args.dim, "captions": n * c}, "protocol": protocol,
                 "cpu": next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                              if ln.startswith("model name")), "?"), "cores": os.cpu_count(),
                 "env": {k: os.environ.get(k) for k in PIN_VARS}, "loadavg_start": os.getloadavg()}
    print(f"# {n} images x K={args.k} x {args.dim}-d vs {n * c} captions, {protocol} + FR; load {os.getloadavg()}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="xmr-bench-cli-") as tmp:
        img, cap = make_data(n, args.k, args.dim, c)
        files = [str(Path(tmp) / "I.npy"), str(Path(tmp) / "C.npy")]
        np.save(files[0], img)
        np.save(files[1], cap)
        base = {k: v for k, v in os.environ.items() if k not in PIN_VARS} | {"PYTHONPATH": str(ROOT)}
        evaluate = [sys.executable, "-m", "xmr", "evaluate", "--images", *files[:1], "--captions", files[1],
                    "--measure", "max", "--protocol", protocol, "--rerank", "fr", "--out", str(Path(tmp) / "M.json")]
        if not args.only_pairs:
            separate_measurements(res, args, img, cap, files, evaluate, base, protocol, tmp)
        del img, cap
        pairs = []
        for i in range(args.pairs):
            g = gemm_child("numpy", files, base)
            wall, cpu, _ = child(evaluate, base)
            # torch's import, timed inside a fresh process: a part of the CLI that no change to xmr removes
            _, _, printed = child([sys.executable, "-c", IMPORT_TORCH], base)
            torch_s = float(printed.strip().splitlines()[-1])
            pairs.append({"gemm_wall_s": g["wall_s"], "cli_wall_s": wall, "ratio_wall": wall / g["wall_s"],
                          "gemm_cpu_s": g["cpu_s"], "cli_cpu_s": cpu, "ratio_cpu": cpu / g["cpu_s"],
                          "import_torch_wall_s": torch_s,
                          "cli_rsum": json.loads((Path(tmp) / "M.json").read_text())["rsum"]})
            line = (f"pair {i + 1}: NumPy's GEMM {g['wall_s']:.2f} s, CLI {wall:.2f} s wall "
                    f"({pairs[-1]['ratio_wall']:.2f}x; CPU {pairs[-1]['ratio_cpu']:.2f}x); "
                    f"torch's import {torch_s:.2f} s")
            if args.floor:
                f_wall, f_cpu, printed = child([sys.executable, __file__, "--floor-child", *files], base)
                f_rsum = json.loads(printed.strip().splitlines()[-1])["rsum"]
                pairs[-1].update(floor_wall_s=f_wall, floor_ratio_wall=f_wall / g["wall_s"], floor_cpu_s=f_cpu,
                                 floor_ratio_cpu=f_cpu / g["cpu_s"], floor_rsum=f_rsum)
                line += (f"; NumPy alone {f_wall:.2f} s ({pairs[-1]['floor_ratio_wall']:.2f}x; CPU "
                         f"{pairs[-1]['floor_ratio_cpu']:.2f}x), RSUM {f_rsum:.3f} against the CLI's "
                         f"{pairs[-1]['cli_rsum']:.3f}")
            print(line, flush=True)
        if pairs:
            med_wall = statistics.median(p["ratio_wall"] for p in pairs)
            med_cpu = statistics.median(p["ratio_cpu"] for p in pairs)
            allowance = 0.4 * statistics.median(p["gemm_wall_s"] for p in pairs)
            med_torch = statistics.median(p["import_torch_wall_s"] for p in pairs)
            res["interleaved"] = {"pairs": pairs, "median_ratio_wall": med_wall, "median_ratio_cpu": med_cpu,
                                  "allowance_s": allowance, "median_import_torch_s": med_torch}
            if args.floor:
                for key in ("floor_ratio_wall", "floor_ratio_cpu"):
                    res["interleaved"][f"median_{key}"] = statistics.median(p[key] for p in pairs)
            print(f"target: default CLI / NumPy's own GEMM, median of {len(pairs)} interleaved pairs: "
                  f"{med_wall:.2f}x wall, {med_cpu:.2f}x CPU ({'met' if med_wall <= 1.4 else 'not met'}: <= 1.4x)\n"
                  f"what the target leaves beside the GEMM: {allowance:.2f} s (0.4 x its median); torch's import "
                  f"alone: {med_torch:.2f} s (median)", flush=True)
            if args.floor:
                print(f"floor: the same computation in NumPy alone, median "
                      f"{res['interleaved']['median_floor_ratio_wall']:.2f}x NumPy's own GEMM wall, "
                      f"{res['interleaved']['median_floor_ratio_cpu']:.2f}x CPU", flush=True)
        if args.profile:
            _, _, printed = child([sys.executable, "-m", "cProfile", "-s", "tottime", *evaluate[1:]], base)
            lines = printed.splitlines()
            top = lines[next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0):][:26]
            res["profile_top"] = top
            print("\n".join(["# cProfile of the default CLI, by own time:", *top]), flush=True)
        if args.only_pairs:
            return finish(res, args)
        from xmr.core.reproducibility import PORTABLE_CPU_ENV

        res["torch_gemm_pinned"] = gemm_child("torch", files, base | PORTABLE_CPU_ENV)
        res["torch_gemm_native"] = gemm_child("torch", files, base)
        for key in ("torch_gemm_pinned", "torch_gemm_native"):
            print(f"{key}: {res[key]['wall_s']:.2f} s wall, {res[key]['cpu_s']:.2f} s CPU", flush=True)
    return finish(res, args)


def finish(res: dict, args: argparse.Namespace) -> int:
    res["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
