"""Helpers for the integration tests: they run the real tools (snakemake, SLURM, dvc, mlflow server, chromium)
in a temp copy of the repository, so they never touch the working tree; the copies get a tiny synth config."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# generator / backbone / recipe sizes that keep a whole synth pipeline to seconds of CPU
TINY_SYNTH = {"seed": 0, "n_train": 40, "n_val": 10, "n_test": 10, "image_size": 64}
TINY_RECIPE = {"model": {"embed_dim": 32},
               "train": {"epochs": 2, "batch_size": 16, "val_max_images": 10}, "eval": {"batch_size": 32}}


def repo_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files: what a clone of the committed tree would hold."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    return [f for f in out.split("\0") if f and (REPO / f).is_file()]


def copy_repo(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for rel in repo_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    return dest


def make_tiny(root: Path, recipes: tuple[str, ...] = ("vsepp",)) -> None:
    """Shrink the synth dataset, its backbone input and the given synth recipes in a repository copy."""
    ds_path = root / "config" / "datasets" / "synth.yaml"
    ds = yaml.safe_load(ds_path.read_text())
    ds["generate"] = dict(TINY_SYNTH)
    ds_path.write_text(yaml.safe_dump(ds, sort_keys=False))
    bb_path = root / "config" / "backbones.yaml"
    bb = yaml.safe_load(bb_path.read_text())
    for key in ("efficientnet_lite0", "efficientnet_lite0_128", "efficientnet_lite0_96"):  # the synth recipes' (the demo's: 96)
        bb[key].update(input_size=64, batch_size=16)
    bb_path.write_text(yaml.safe_dump(bb, sort_keys=False))
    # the shipped summary gathers every synth method; the copy builds only the shrunk recipes
    cfg_path = root / "config" / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["default"]["targets"] = list(recipes)
    cfg.setdefault("summary_targets", {})["synth"] = list(recipes)
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for name in recipes:
        path = root / "config" / "recipes" / "synth" / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        for section, values in TINY_RECIPE.items():
            doc[section] = {**doc.get(section, {}), **values}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


def tool_env(root: Path, **extra: str) -> dict[str, str]:
    """Environment for the tools: the venv first on PATH (jobs start `snakemake` and `python` from it), offline
    hubs, and an MLflow store inside the copy."""
    env = dict(os.environ)
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               MLFLOW_ENABLE_TELEMETRY="false", MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}",
               PYTHONDONTWRITEBYTECODE="1")
    for key in ("XMR_SLURM_PARTITION", "XMR_SLURM_ACCOUNT", "XMR_PARENT_RUN_ID", "SNAKEMAKE_PROFILE", "XMR_DIST_CHILD",
                "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(extra)
    return env


def default_sigint() -> None:
    """``preexec_fn`` of a process a test stops with Ctrl-C: SIGINT back to its default action. A shell that starts
    the suite in the background (``cmd &``, ``nohup``) starts it with SIGINT ignored, and an ignored signal stays
    ignored in every process started below it: the test's Ctrl-C would then stop nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen, grace: float = 30) -> str:
    """Stop a process started with ``start_new_session=True`` and everything it started: SIGINT to its process
    group (snakemake ignores SIGTERM while jobs run; SIGINT makes it cancel them), SIGKILL after ``grace``
    seconds. Returns what it printed."""
    import signal

    out = ""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=wait)
            return out or ""
        except subprocess.TimeoutExpired:
            continue
    return out or ""


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run a tool in its own process group; on failure the assertion shows the end of its output; on timeout
    the whole group is stopped (:func:`stop_group`), so no orphaned job keeps running or holds the pipe."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = stop_group(proc)
        raise AssertionError(f"timed out after {timeout} s: {' '.join(cmd)}\n{out[-4000:]}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, "")
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd)} -> rc {proc.returncode}\n{out[-6000:]}"
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_apt_packages(binaries: dict[str, str]) -> dict[str, str]:
    """``{binary: Debian package}`` -> ``{binary: path}``, installing what is missing with apt-get (CI starts
    from a fresh machine; .ci/run installs them up front). Skips, with the reason, only where this machine
    cannot install them: not root, no apt-get, no reachable package mirror."""
    import pytest

    missing = sorted({pkg for binary, pkg in binaries.items() if not shutil.which(binary)})
    if missing:
        if os.geteuid() != 0:
            pytest.skip(f"needs {' '.join(missing)} (apt-get install as root); not root here")
        if not shutil.which("apt-get"):
            pytest.skip(f"needs {' '.join(missing)}; no apt-get on this machine")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        if subprocess.run(install, env=env, capture_output=True).returncode != 0:
            if subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True).returncode != 0:
                pytest.skip(f"needs {' '.join(missing)}; apt-get update failed (no package mirror reachable)")
            proc = subprocess.run(install, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    paths = {binary: shutil.which(binary) for binary in binaries}
    assert all(paths.values()), f"installed {missing} but still missing: {paths}"
    return paths
