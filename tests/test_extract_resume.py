"""Kill-and-resume: `xmr extract` killed with SIGKILL mid-run, rerun, equals an uninterrupted run."""

import os
import signal
import time

import numpy as np
import torch

from conftest import run_xmr, run_xmr_one_thread, start_xmr_forked, tiny_extraction_config
from xmr.config.loader import load_backbone_config, load_dataset_config
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
    args = ["extract", "--dataset", "synth", "--backbone", "eff", "--split", "train", "--out", str(out),
            "--config-dir", str(cfg_dir), "--workers", "0", "--no-progress"]

    def shards():
        return sorted(p.name for p in parts.glob("[0-9]*.npz")) if parts.exists() else []

    proc = start_xmr_forked(*args)  # its own process, one torch thread (conftest.xmr_env)
    deadline = time.time() + 180
    while len(shards()) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGSTOP)  # freeze first, so the count below is what the kill interrupts
    done_before = shards()
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait().returncode == -signal.SIGKILL
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

    resumed = run_xmr_one_thread(*args)  # the rerun, in this process at the killed one's single thread
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


def test_threads_option_and_channels_last_layout_keep_the_features(tmp_path):
    """`xmr extract --threads N` (what the workflow passes): the backbone runs channels-last on N threads, and its
    features equal those of the plain NCHW forward within float32 summation-order noise; --threads 0 is refused
    in one line, before anything is written."""
    cfg_dir = tiny_extraction_config(tmp_path, 4, input_size=64, batch_size=2)
    out = tmp_path / "features" / "train.h5"
    cmd = ["extract", "--dataset", "synth", "--backbone", "eff", "--split", "train", "--out", out, "--config-dir",
           cfg_dir, "--workers", "0", "--no-progress"]
    bad = run_xmr(*cmd, "--threads", "0")
    assert bad.returncode != 0 and "--threads 0" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not out.exists()
    done = run_xmr(*cmd, "--threads", "2")
    assert done.returncode == 0, done.stdout + done.stderr

    from xmr.features.backbones import build_backbone

    bb_cfg = load_backbone_config("eff", cfg_dir)
    nchw = build_backbone(bb_cfg)
    nchw.channels_last = False  # the reference: the same weights in the default layout
    assert type(nchw).channels_last  # what extraction uses for this backbone
    ref = FeatureFile(extract_features(load_split(load_dataset_config("synth", cfg_dir), "train"), bb_cfg,
                                       tmp_path / "ref.h5", batch_size=2, workers=0, progress=False, backbone=nchw))
    got = FeatureFile(out)
    a, b = np.stack([got[i] for i in range(4)]), np.stack([ref[i] for i in range(4)])
    assert a.shape == b.shape == (4, 4, 1280)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)
