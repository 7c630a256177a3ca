"""Shared fixtures: a tiny synthetic dataset with real EfficientNet-Lite0 features, built once per session."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs three pytest-xdist workers on two cores: torch's default one thread per core in each worker
    # (and in the commands it starts) would oversubscribe them, and OpenMP's spin-waits make that many times slower
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]
#: scikit-learn's two sample photos (china.jpg, flower.jpg: 640 x 427 JPEGs), real files to decode
SAMPLE_PHOTOS = Path(importlib.util.find_spec("sklearn").origin).parent / "datasets" / "images"  # no import


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch at one intra-op thread inside the block, its previous count restored after."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture
def one_thread():
    """2 shared cores: torch's default two threads spin against other processes (orders of magnitude slower)."""
    with one_torch_thread():
        yield

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")


class TinySynth:
    """A config dir + data + features for the `synth` dataset at toy size (64 px images, 2x2 grid)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_dir = root / "config"
        self.features_dir = root / "features"

    def dataset_config_dir(self, root: Path) -> Path:
        """``root/config`` holding this set's dataset config (its data stays where it is): a config dir of a test's
        own, for backbones or settings the shared one lacks."""
        cfg_dir = root / "config"
        (cfg_dir / "datasets").mkdir(parents=True)
        (cfg_dir / "datasets" / "synth.yaml").write_text((self.config_dir / "datasets" / "synth.yaml").read_text())
        return cfg_dir

    def recipe(self, method: str, name: str | None = None, **sections) -> Path:
        """Write a recipe extending the repo's config/methods/{method}.yaml with tiny sizes; returns its path.
        ``sections`` deep-override (e.g. ``model={"embed_dim": 32}``, ``train={"epochs": 2}``)."""
        from xmr.config.loader import deep_merge

        method_file = REPO / "config" / "methods" / f"{method}.yaml"
        base = {  # a plugin's method has no method file: its schema holds every default
            **({"extends": str(method_file)} if method_file.exists() else {"method": method}),
            "dataset": "synth",
            "features": {"backbone": "efficientnet_lite0", "dir": str(self.features_dir)},
            "model": {"embed_dim": 32},
            "loss": {},
            "optim": {},
            "train": {"epochs": 1, "batch_size": 16, "val_max_images": 10},
            "eval": {"batch_size": 32},
            "tracking": {"enabled": False},
        }
        doc = deep_merge(base, sections)
        path = self.config_dir / "recipes" / "synth" / f"{name or method}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


@pytest.fixture(scope="module")
def module_tmp(request, tmp_path_factory) -> Iterator[Callable[[str], Path]]:
    """``tmp_path_factory.mktemp`` for a module's fixtures, whose folders go when the module ends unless one of its
    tests failed: the released checkpoints and trained runs add up to GBs, and a full disk once failed CI."""
    made: list[Path] = []
    failed_before = request.session.testsfailed

    def mktemp(name: str) -> Path:
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield mktemp
    remove_unless_failed(request.session, failed_before, made)


def remove_unless_failed(session: pytest.Session, failed_before: int, paths: list[Path]) -> None:
    """Remove ``paths`` unless a test has failed since the count was ``failed_before`` (kept to look at)."""
    if session.testsfailed == failed_before:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_synth(tmp_path_factory) -> TinySynth:
    from xmr.config.loader import load_backbone_config, load_dataset_config
    from xmr.data import load_split
    from xmr.data.synth import generate_synth
    from xmr.features.extract import extract_features

    root = tmp_path_factory.mktemp("tiny_synth")
    cfg_dir = root / "config"
    (cfg_dir / "datasets").mkdir(parents=True)
    ds = yaml.safe_load((REPO / "config" / "datasets" / "synth.yaml").read_text())
    ds.update(root=str(root / "data" / "synth"), annotations=str(root / "data" / "synth" / "dataset_synth.json"),
              images=str(root / "data" / "synth" / "images"),
              generate={"seed": 0, "n_train": 48, "n_val": 12, "n_test": 12, "image_size": 64})
    (cfg_dir / "datasets" / "synth.yaml").write_text(yaml.safe_dump(ds))
    (cfg_dir / "backbones.yaml").write_text(yaml.safe_dump(
        {"efficientnet_lite0": {"name": "efficientnet_lite0", "input_size": 64, "batch_size": 16}}))
    generate_synth(ds["root"], progress=False, captions_per_image=5, **ds["generate"])
    dcfg = load_dataset_config("synth", cfg_dir)
    bcfg = load_backbone_config("efficientnet_lite0", cfg_dir)
    for split in ("train", "val", "test"):
        extract_features(load_split(dcfg, split), bcfg, root / "features" / "synth" / "efficientnet_lite0" /
                         f"{split}.h5", batch_size=16, workers=0, progress=False)
    return TinySynth(root)


@pytest.fixture(scope="session")
def tiny_synth_run(tiny_synth, tmp_path_factory) -> Path:
    """A DVSE run trained one epoch on tiny_synth (for the commands that read a run: search, score, the docs)."""
    out = tmp_path_factory.mktemp("tiny_synth_run") / "dvse"
    train_cli(tiny_synth.recipe("dvse", name="dvse_docs"), out)
    return out


def tiny_extraction_config(root: Path, n_train: int, input_size: int, batch_size: int) -> Path:
    """A small synth set under ``root/synth`` and a config dir (dataset ``synth``, backbone ``eff``) for extraction
    tests; returns the config dir."""
    from xmr.data.synth import generate_synth

    data = root / "synth"
    generate_synth(data, n_train=n_train, n_val=1, n_test=1, image_size=64, progress=False)
    cfg_dir = root / "config"
    (cfg_dir / "datasets").mkdir(parents=True)
    (cfg_dir / "datasets" / "synth.yaml").write_text(yaml.safe_dump({
        "name": "synth", "format": "karpathy", "annotations": str(data / "dataset_synth.json"),
        "images": str(data / "images"), "captions_per_image": 5}))
    (cfg_dir / "backbones.yaml").write_text(yaml.safe_dump(
        {"eff": {"name": "efficientnet_lite0", "input_size": input_size, "batch_size": batch_size}}))
    return cfg_dir


def toy_config(tmp_path: Path, recipes: tuple[str, ...] = ("a",)) -> Path:
    """``tmp_path/config`` with a dataset `toy` (synth's config, data never generated), the backbones, and recipes
    ``config/recipes/toy/{name}.yaml`` (VSE++ at embedding 8, batch 32) that resolve to run configs."""
    cfg = tmp_path / "config"
    (cfg / "recipes" / "toy").mkdir(parents=True)
    (cfg / "datasets").mkdir()
    toy = yaml.safe_load((REPO / "config" / "datasets" / "synth.yaml").read_text())
    toy.update(name="toy", root=str(tmp_path / "data"), annotations=str(tmp_path / "data" / "none.json"))
    (cfg / "datasets" / "toy.yaml").write_text(yaml.safe_dump(toy))
    (cfg / "backbones.yaml").write_text((REPO / "config" / "backbones.yaml").read_text())
    for r in recipes:
        (cfg / "recipes" / "toy" / f"{r}.yaml").write_text(
            f"extends: {REPO / 'config' / 'methods' / 'vsepp.yaml'}\ndataset: toy\n"
            "features: {backbone: efficientnet_lite0_128}\nmodel: {embed_dim: 8}\ntrain: {batch_size: 32}\n")
    return cfg


def xmr_env(**extra: str) -> dict[str, str]:
    """The environment of an ``xmr`` subprocess: this checkout's package first on the path (an inherited
    PYTHONPATH after it: packages copied to a machine that lacks them), one thread (2 shared cores), no fault
    injection and no parent MLflow run unless ``extra`` sets ``XMR_FAULT`` or ``XMR_PARENT_RUN_ID``."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("XMR_FAULT", None)
    env.pop("XMR_PARENT_RUN_ID", None)  # a sweep this suite runs under is not the tests' commands' parent
    env.update(extra)
    return env


def run_xmr(*args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None, timeout: float = 600,
            check: bool = False) -> subprocess.CompletedProcess:
    """``xmr ARGS`` as a user types it, run in this process (:func:`xmr_in_process`: the same argument parsing,
    output and exit status, without a new interpreter importing torch and MLflow each time); with ``env`` (fault
    injection, plugins) in a subprocess (:func:`run_xmr_process`). ``check``: the command must succeed."""
    if env is not None:
        return run_xmr_process(*args, cwd=cwd, env=env, timeout=timeout, check=check)
    r = xmr_in_process(*args, cwd=cwd)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def run_xmr_process(*args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                    timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    """``python -m xmr ARGS`` in a subprocess, for the tests where the process is the point (signals, locks, what
    a fresh interpreter imports, fault injection through the environment); ``env`` defaults to :func:`xmr_env`."""
    r = subprocess.run([sys.executable, "-m", "xmr", *map(str, args)], cwd=cwd, env=env or xmr_env(),
                       capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def start_xmr_forked(*args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None):
    """``xmr ARGS`` in its own process, forked from a server that has imported torch, MLflow and xmr once per
    worker (tests/forked_xmr.py): for a command a test kills, or several at once, without each paying ~5 s of
    imports. ``env`` (default :func:`xmr_env`) may differ from :func:`xmr_env` in anything but what a process reads
    as it starts (``forked_xmr.IMPORT_TIME``). Returns a handle: ``poll()``, ``kill()``, ``wait(timeout)``."""
    import forked_xmr

    return forked_xmr.start(args, cwd, env or xmr_env(), server_env=xmr_env())


def run_xmr_forked(*args, cwd: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                   timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    """:func:`start_xmr_forked`, waited for: what it printed and its exit status (negative: the killing signal)."""
    r = start_xmr_forked(*args, cwd=cwd, env=env).wait(timeout)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def xmr_in_process(*args, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``xmr.cli.main(ARGS)`` here, as the entry point runs it: stdout and stderr captured, the exit status returned
    (argparse's exits, a crash's traceback and status 1 as the interpreter would give them). What a command changes
    in the process (working folder, environment, torch's threads) is put back."""
    import io

    from forked_xmr import main_status

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    here, environ = os.getcwd(), dict(os.environ)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main_status(argv)
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(environ)
        if threads is not None or "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads or 1)
    return subprocess.CompletedProcess(["xmr", *argv], rc, out.getvalue(), err.getvalue())


def run_xmr_imports(*args, cwd: str | os.PathLike | None = None) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m xmr ARGS``: the command must succeed; returns it and the names of every module the
    process imported (the ``-X importtime`` log on stderr, one line per module)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "xmr", *map(str, args)], cwd=cwd, env=xmr_env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    return r, {line.rsplit("|", 1)[1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}


def imports_torch(modules: set[str]) -> bool:
    return any(name == "torch" or name.startswith("torch.") for name in modules)


def train_cli(recipe: Path, out: Path, kill_after_first_epoch: bool = False):
    """``xmr train``: with ``kill_after_first_epoch`` in its own process (:func:`start_xmr_forked`), SIGKILLed as
    soon as last.pt exists (returns the exit code); else in this process (:func:`run_xmr_one_thread`), and it must
    finish (returns what it printed).
    Both sides run one torch thread, so a run resumed here continues a killed one bit for bit."""
    args = ["train", "--config", str(recipe), "--out-dir", str(out), "--no-progress"]
    if not kill_after_first_epoch:
        r = run_xmr_one_thread(*args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout + r.stderr
    proc = start_xmr_forked(*args)
    deadline = time.time() + 600
    while not (out / "last.pt").exists():
        if proc.poll() is not None or time.time() > deadline:
            r = proc.wait(0)
            raise AssertionError(f"ended before its first checkpoint ({r.returncode}):\n{r.stdout}{r.stderr}")
        time.sleep(0.02)
    proc.kill()
    return proc.wait().returncode


def run_xmr_one_thread(*args, cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
    """``xmr ARGS`` in this process at one torch thread, as :func:`xmr_env` gives a subprocess: a test that compares
    this process's run with a subprocess's (a kill, then the rerun here) needs the same kernels' reduction order."""
    with one_torch_thread():
        return xmr_in_process(*args, cwd=cwd)


def history_rows(out: Path) -> list[dict]:
    """history.csv of a run without the wall-clock columns (what must match between a resumed and a straight run)."""
    with open(out / "history.csv") as f:
        return [{k: v for k, v in row.items() if k not in ("seconds", "samples_per_s")} for row in csv.DictReader(f)]


INTEGRATION = Path(__file__).resolve().parent / "integration"


#: the files that take longest (`make test --durations`), longest first: `make test` hands files to its workers in
#: collection order (pytest-xdist's --dist loadfile with --no-loadscope-reorder), so these start first and the run
#: does not end on one worker finishing a long file while the other waits
LONGEST_FILES = ("integration/test_slurm_profile.py", "integration/test_dvc_pipeline.py",
                 "integration/test_concurrent_training.py", "test_benchmark_sanity.py", "test_kill_points.py",
                 "test_resume.py", "test_train_e2e.py", "test_docs.py", "test_ddp.py", "test_plugins.py",
                 "integration/test_tiny_clip_synth.py", "test_paper_map.py", "test_first_commands.py",
                 "integration/test_snakemake_kill.py", "integration/test_own_dataset.py",
                 "integration/test_mlflow_ui.py", "test_reproducibility.py", "test_run_logs_status.py")


def collection_rank(path: Path) -> int:
    """Where a test file goes in the run: :data:`LONGEST_FILES` first, in that order, then every other file."""
    rel = path.resolve().relative_to(Path(__file__).resolve().parent).as_posix()
    return LONGEST_FILES.index(rel) if rel in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(config, items):
    """Every test under tests/integration/ drives a real outside component (Snakemake, SLURM, DVC, an MLflow server,
    Chromium, concurrent processes): it is marked ``integration`` and ``slow``, which `make test-fast` leaves out
    (`make test` and CI run everything). The longest files are moved to the front (:func:`collection_rank`; a
    stable sort: the tests of a file keep their order)."""
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: collection_rank(Path(str(item.fspath))))


#: GB free that a run needs under pytest's temporary folder: a full run held at most 1.3 GB there at once
#: (sampled every 5 s), after a run that kept 3.1 GB to its end had filled CI's disk; XMR_TEST_DISK_GB overrides
TEST_DISK_GB = 2.0


def low_disk_message(folder: str, free_bytes: int, need_gb: float) -> str | None:
    """The one line the suite stops with when ``folder`` has less than ``need_gb`` free, else None."""
    free_gb = free_bytes / 2**30
    if free_gb >= need_gb:
        return None
    return (f"{folder} has {free_gb:.1f} GB free and the test suite writes up to {need_gb:g} GB there: "
            f"free some space, or point TMPDIR at a larger disk")


def repo_run_folders() -> set[str]:
    """The run folders under the checkout's ``mlruns/`` (``{experiment id}/{run id}``)."""
    return {f"{p.parent.name}/{p.name}" for p in (REPO / "mlruns").glob("*/*") if p.is_dir()}


def orphan_run_folders(before: set[str]) -> list[str]:
    """Run folders that appeared under the checkout's ``mlruns/`` since ``before`` and that the checkout's own
    ``mlflow.db`` does not hold: a test's run (its store temporary) whose artifacts went into the repository. A
    ``make demo`` beside the suite writes runs its store holds, and is not counted."""
    new = repo_run_folders() - before
    db = REPO / "mlflow.db"
    if not new or not db.exists():
        return sorted(new)
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
            known = {row[0] for row in con.execute("SELECT run_uuid FROM runs")}
    except sqlite3.Error:  # locked or not an MLflow store: nothing to tell them apart by
        return []
    return sorted(f for f in new if f.split("/")[1] not in known)


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when tests left run artifacts in the checkout (MLflow writes a new experiment's artifacts under
    ``./mlruns`` of the creating process unless told otherwise; xmr puts them beside the store)."""
    if hasattr(session.config, "workerinput") or not hasattr(session.config, "_xmr_run_folders"):
        return
    if left := orphan_run_folders(session.config._xmr_run_folders):
        session.config._xmr_orphans = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if left := getattr(config, "_xmr_orphans", None):
        terminalreporter.write_line(f"the tests left {len(left)} run folder(s) in {REPO / 'mlruns'} that no store "
                                    f"holds (a test created an MLflow experiment under the working folder): "
                                    f"{', '.join(left[:5])}", red=True)


def pytest_sessionstart(session):
    """Stop before the first test on a nearly full disk (one line), not with hundreds of failed writes; note the
    checkout's MLflow run folders (:func:`pytest_sessionfinish`)."""
    if hasattr(session.config, "workerinput"):  # pytest-xdist: the controller has checked
        return
    session.config._xmr_run_folders = repo_run_folders()
    base = session.config.option.basetemp
    folder = Path(base).resolve().parent if base else Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or
                                                            tempfile.gettempdir())
    while not folder.exists():  # a --basetemp or temp root that pytest has yet to create: the disk it will be on
        folder = folder.parent
    try:
        need_gb = float(os.environ.get("XMR_TEST_DISK_GB", TEST_DISK_GB))
    except ValueError:
        pytest.exit(f"XMR_TEST_DISK_GB={os.environ['XMR_TEST_DISK_GB']!r}: give a number of GB, e.g. 2", returncode=1)
    message = low_disk_message(str(folder), shutil.disk_usage(folder).free, need_gb)
    if message:
        pytest.exit(message, returncode=1)
