"""kill -9 at chosen points (docs/faults.md), then the same command again: training and extraction end exactly as
an uninterrupted run (CPU), and after each kill every file a reader can open is complete.

The kill is the trainer's/writer's own ``XMR_FAULT=kill_at:PHASE:N`` hook (xmr/core/io.py ``fault_point``): the
process SIGKILLs itself the N-th time it reaches PHASE, so each point is hit exactly, not by timing.
Atomic writes (``write`` phase) are counted in order; a 2-epoch training run writes config.yaml (1), then per
epoch last.pt, best.pt (when the epoch is the best), history.csv; extraction writes the settings stamp (1),
one shard per batch, then the assembled store (last)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from xmr.core.io import load_checkpoint

from conftest import run_xmr_forked, run_xmr_one_thread, xmr_env

REPO = Path(__file__).resolve().parents[1]


def _xmr(args: list[str], fault: str | None = None) -> subprocess.CompletedProcess:
    """With ``fault``: its own process, which kills itself there (one torch thread, :func:`xmr_env`); without: the
    reference and the rerun, in this process at one torch thread too (the rerun continues the killed run's files)."""
    if fault:
        return run_xmr_forked(*args, env=xmr_env(XMR_FAULT=fault))
    return run_xmr_one_thread(*args)


def _readable_or_absent(out: Path) -> None:
    """After a kill: each checkpoint/summary is the previous complete version or absent, never torn."""
    for name in ("last.pt", "best.pt"):
        if (out / name).exists():
            load_checkpoint(out / name)  # raises on a torn file
    for name in ("train.json",):
        if (out / name).exists():
            json.loads((out / name).read_text())


def _summary(out: Path) -> dict:
    s = json.loads((out / "train.json").read_text())
    s.pop("train_seconds")
    for row in s["history"]:
        row.pop("seconds"), row.pop("samples_per_s")
    return s


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# (XMR_FAULT, what it interrupts); epochs=2, 15 steps per epoch
TRAIN_POINTS = {
    "kill_at:step:4": "inside epoch 1 (no checkpoint yet)",
    "kill_at:step:21": "inside epoch 2",
    "kill_at:validate:1": "during epoch 1's validation",
    "kill_at:write:2": "during epoch 1's last.pt write (temporary complete, not renamed)",
    "kill_at:write:3": "during epoch 1's best.pt write (last.pt already saved: best.pt must be rebuilt)",
    "kill_at:write:4": "during epoch 1's history.csv write",
    "kill_at:validate:2": "during epoch 2's validation",
}


@pytest.fixture(scope="module")
def train_reference(tiny_synth, module_tmp):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_kill", train={"epochs": 2, "batch_size": 16})
    ref = module_tmp("kill_ref") / "run"
    r = _xmr(["train", "--config", str(recipe), "--out-dir", str(ref), "--no-progress"])
    assert r.returncode == 0, r.stderr
    return recipe, ref


@pytest.mark.parametrize("fault", list(TRAIN_POINTS))
def test_training_killed_then_rerun_equals_uninterrupted(train_reference, tmp_path, fault):
    recipe, ref = train_reference
    out = tmp_path / "run"
    args = ["train", "--config", str(recipe), "--out-dir", str(out), "--no-progress"]
    killed = _xmr(args, fault)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert not (out / "train.json").exists()
    _readable_or_absent(out)
    if fault in ("kill_at:step:21", "kill_at:validate:2"):  # really in epoch 2: epoch 1 is checkpointed
        assert load_checkpoint(out / "last.pt")["epoch"] == 0
    if fault in ("kill_at:step:4", "kill_at:validate:1", "kill_at:write:2"):
        assert not (out / "last.pt").exists()
    if fault == "kill_at:write:3":
        assert (out / "last.pt").exists() and not (out / "best.pt").exists()
    rerun = _xmr(args)
    assert rerun.returncode == 0, rerun.stderr
    assert _summary(out) == _summary(ref)  # metrics JSON: every epoch's loss and validation numbers
    for name in ("last.pt", "best.pt"):
        got, want = load_checkpoint(out / name), load_checkpoint(ref / name)
        _assert_same_weights(got["model"], want["model"])
        assert got["epoch"] == want["epoch"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


# --- extraction: 8 images, batches of 2 -> writes: stamp (1), shards (2..5), store (6) ---------------------------

N_IMAGES, BATCH = 8, 2
EXTRACT_POINTS = {
    "kill_at:write:1": "writing the settings stamp",
    "kill_at:write:2": "writing the first shard",
    "kill_at:write:4": "writing a middle shard",
    "kill_at:write:5": "writing the last shard",
    "kill_at:write:6": "assembling the store (temporary .train.h5.*.h5 complete, not renamed)",
}


@pytest.fixture(scope="module")
def extract_reference(module_tmp):
    from conftest import tiny_extraction_config

    root = module_tmp("kill_extract")
    cfg_dir = tiny_extraction_config(root, N_IMAGES, input_size=64, batch_size=BATCH)
    ref = root / "ref" / "train.h5"
    r = _xmr(_extract_args(cfg_dir, ref))
    assert r.returncode == 0, r.stderr
    return cfg_dir, ref


def _extract_args(cfg_dir: Path, out: Path) -> list[str]:
    return ["extract", "--dataset", "synth", "--backbone", "eff", "--split", "train", "--out", str(out),
            "--config-dir", str(cfg_dir), "--workers", "0", "--no-progress"]


def _store(path: Path) -> tuple[dict, dict]:
    with h5py.File(path, "r") as f:
        data = {k: f[k][:] for k in f}
        attrs = {k: v for k, v in f.attrs.items() if k != "created"}
    return data, attrs


@pytest.mark.parametrize("fault", list(EXTRACT_POINTS))
def test_extraction_killed_then_rerun_equals_uninterrupted(extract_reference, tmp_path, fault):
    cfg_dir, ref = extract_reference
    out = tmp_path / "features" / "train.h5"
    parts = out.with_name("train.h5.parts")
    killed = _xmr(_extract_args(cfg_dir, out), fault)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert not out.exists()  # the store appears complete or not at all
    kept = sorted(p.name for p in parts.glob("[0-9]*.npz")) if parts.exists() else []
    n_write = int(fault.rsplit(":", 1)[1])
    assert len(kept) == max(0, min(n_write - 2, N_IMAGES // BATCH))  # shards completed before the kill
    for shard in kept:  # every shard present is complete
        with np.load(parts / shard) as z:
            assert len(z["features"]) == BATCH
    if fault == "kill_at:write:6":
        assert list(out.parent.glob(".train.h5.*.h5"))  # the torn assembly the rerun must clean up
    rerun = _xmr(_extract_args(cfg_dir, out))
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.h5"]  # no parts, no temporary files
    got, got_attrs = _store(out)
    want, want_attrs = _store(ref)
    assert got.keys() == want.keys() and got_attrs == want_attrs
    for k in want:  # dataset by dataset
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # (that kept shards are reused, not recomputed, is test_extract_resume's marked-shard check)


# --- import: a BUTD TSV of 5 images -> writes: stamp (1), one shard (2), store (3) -------------------------------

IMPORT_POINTS = ["kill_at:write:1", "kill_at:write:2", "kill_at:write:3"]


@pytest.mark.parametrize("fault", IMPORT_POINTS)
def test_import_killed_then_rerun_equals_uninterrupted(tmp_path, fault):
    from test_importers import _tsv_record, _write_tsv

    tsv = tmp_path / "feats.tsv"
    _write_tsv(tsv, [_tsv_record(str(i), 100 + i, 80, 2 + i % 3, seed=i)[0] for i in range(5)])

    def args(out: Path) -> list[str]:
        return ["import-features", "--format", "butd_tsv", "--src", str(tsv), "--out", str(out), "--no-progress"]

    ref, out = tmp_path / "ref" / "f.h5", tmp_path / "got" / "f.h5"
    assert _xmr(args(ref)).returncode == 0
    killed = _xmr(args(out), fault)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert not out.exists()
    rerun = _xmr(args(out))
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == ["f.h5"]
    (got, got_attrs), (want, want_attrs) = _store(out), _store(ref)
    assert got.keys() == want.keys() and got_attrs == want_attrs
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
