"""Kill-and-resume: `xmr extract` killed with SIGKILL mid-run, rerun, equals an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

from conftest import tiny_extraction_config
from xmr.config import load_backbone_config, load_dataset_config
from xmr.data import load_split
from xmr.features.extract import extract_features
from xmr.features.store import FeatureFile

N_IMAGES, BATCH = 16, 2


def _setup(tmp_path):
    # upscaled input so that one batch takes long enough (~0.1 s) to stop the process between shards
    return tiny_extraction_config(tmp_path, N_IMAGES, input_size=160, batch_size=BATCH)


def test_sigkill_then_resume_equals_uninterrupted(tmp_path):
    cfg_dir = _setup(tmp_path)
    out = tmp_path / "features" / "train.h5"
    parts = out.with_name("train.h5.parts")
    cmd = [sys.executable, "-m", "xmr", "extract", "--dataset", "synth", "--backbone", "eff", "--split", "train",
           "--out", str(out), "--config-dir", str(cfg_dir), "--workers", "0", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def shards():
        return sorted(p.name for p in parts.glob("[0-9]*.npz")) if parts.exists() else []

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while len(shards()) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)  # freeze first, so the count below is what the kill interrupts
    done_before = shards()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and 2 <= len(done_before) < N_IMAGES // BATCH, done_before
    # what a kill inside a shard write leaves: atomic_path's hidden temporary file (never a shard)
    (parts / f".{N_IMAGES - BATCH:09d}.npz.torn.npz").write_bytes(b"half a shard")
    # mark one finished shard: if the rerun reuses it (instead of recomputing) its rows carry the mark
    marked = parts / done_before[0]
    with np.load(marked) as z:
        arrays = dict(z)
    arrays["features"] = arrays["features"] + 1000.0
    with open(marked, "wb") as f:
        np.savez(f, **arrays)
    marked_rows = arrays["rows"]

    resumed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert not parts.exists()

    torch.set_num_threads(1)
    ds = load_dataset_config("synth", cfg_dir)
    split = load_split(ds, "train")
    ref = FeatureFile(extract_features(split, load_backbone_config("eff", cfg_dir), tmp_path / "ref.h5",
                                       batch_size=BATCH, workers=0, progress=False))
    got = FeatureFile(out)
    assert got.image_ids == ref.image_ids == split.image_ids and len(set(got.image_ids)) == N_IMAGES
    assert got.shape == ref.shape == (N_IMAGES, 25, 1280)
    expect = np.stack([ref[i] for i in range(N_IMAGES)])
    expect[marked_rows] += 1000.0
    np.testing.assert_allclose(np.stack([got[i] for i in range(N_IMAGES)]), expect, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got.num_regions, ref.num_regions)
