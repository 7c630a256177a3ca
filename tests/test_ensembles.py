"""Ensembles (config/ensembles/{dataset}/{name}.yaml, xmr/studies/ensembles.py): the mean of runs' similarity
matrices through `xmr ensemble`, evaluated by `xmr test` like a recipe; values worked out by hand."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from conftest import run_xmr, toy_config

# two runs' test matrices: 2 images x 4 captions, captions 2i and 2i+1 belong to image i
A = np.array([[0.9, 0.1, 0.2, 0.8],
              [0.3, 0.7, 0.6, 0.4]], dtype=np.float32)
B = np.array([[0.1, 0.5, 0.4, 0.6],
              [0.5, 0.3, 0.8, 0.2]], dtype=np.float32)
# (A + B) / 2 by hand
MEAN = np.array([[0.5, 0.3, 0.3, 0.7],
                 [0.4, 0.5, 0.7, 0.3]], dtype=np.float32)


def toy_runs(tmp_path, members=("a", "b"), matrices=(A, B)):
    """A toy config with recipes ``members`` and the ensemble ``e`` of them, and each member's run directory
    (its saved config, 2 captions per image, protocol plain; its test matrix)."""
    from xmr.run.config import load_run_config

    cfg_dir = toy_config(tmp_path, members)
    (cfg_dir / "ensembles" / "toy").mkdir(parents=True)
    (cfg_dir / "ensembles" / "toy" / "e.yaml").write_text(f"members: [{', '.join(members)}]\n")
    for name, sims in zip(members, matrices):
        cfg = load_run_config(cfg_dir / "recipes" / "toy" / f"{name}.yaml")
        cfg["dataset_cfg"].update(captions_per_image=2, protocols=["plain"], format="precomp")
        run = tmp_path / "runs" / "toy" / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        np.save(run / "test_sims.npy", sims)
    return cfg_dir


def test_an_ensemble_of_two_runs_is_their_mean_and_evaluates_like_a_recipe(tmp_path):
    toy_runs(tmp_path)
    r = run_xmr("ensemble", "--dataset", "toy", "--name", "e", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    mean = np.load(tmp_path / "runs" / "toy" / "e" / "test_sims.npy")
    assert mean.dtype == np.float32
    np.testing.assert_allclose(mean, MEAN, atol=1e-6)
    assert json.loads((tmp_path / "runs" / "toy" / "e" / "ensemble.json").read_text())["members"] == ["a", "b"]
    r = run_xmr("test", "--run", "runs/toy/e", "--sims", "runs/toy/e/test_sims.npy", "--out", "e.json",
                "--no-tracking", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "e.json").read_text())
    # i2t: image 0 ranks caption 3 (0.7, image 1's) above its caption 0 (0.5): rank 2; image 1's caption 2 first.
    # t2i: captions 0 and 2 find their image first; caption 1 (0.3 vs 0.5) and caption 3 (0.7 vs 0.3) second.
    assert res["recipe"] == "e" and res["protocol"] == "plain"
    assert [res["i2t"][k] for k in ("r1", "r5", "r10")] == [50.0, 100.0, 100.0]
    assert [res["t2i"][k] for k in ("r1", "r5", "r10")] == [50.0, 100.0, 100.0]
    assert res["rsum"] == 500.0


def test_weighted_mean_of_matrices_given_by_path(tmp_path):
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "b.npy", B.astype(np.float64))
    r = run_xmr("ensemble", "--sims", "a.npy", "b.npy", "--weights", "3", "1", "--out", "m.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # (3 A + B) / 4 by hand
    np.testing.assert_allclose(np.load(tmp_path / "m.npy"), [[0.7, 0.2, 0.25, 0.75], [0.35, 0.6, 0.65, 0.35]],
                               atol=1e-6)


@pytest.mark.parametrize("case,message", [
    ("missing", "runs/toy/b/test_sims.npy: not found; member 'b'"),
    ("shape", "differs from"),
    ("clash", "has the same name"),
])
def test_bad_ensembles_fail_in_one_line(tmp_path, case, message):
    cfg_dir = toy_runs(tmp_path, matrices=(A, A[:, :2] if case == "shape" else B))
    if case == "missing":
        (tmp_path / "runs" / "toy" / "b" / "test_sims.npy").unlink()
    if case == "clash":
        (cfg_dir / "ensembles" / "toy" / "a.yaml").write_text("members: [a, b]\n")
    r = run_xmr("ensemble", "--dataset", "toy", "--name", "a" if case == "clash" else "e", cwd=tmp_path)
    assert r.returncode != 0
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "runs" / "toy" / "e" / "test_sims.npy").exists()


def test_doctor_reports_what_the_members_of_an_ensemble_need():
    """`xmr doctor` (and the workflow's preflight) on an ensemble target: each member's pieces (DivE†, COCO)."""
    from conftest import REPO

    r = run_xmr("doctor", "coco", "dive_ensemble_fr", cwd=REPO)
    assert "(recipe dive_ensemble, re-ranker fr)" in r.stdout, r.stdout + r.stderr
    # the members' features (BUTD regions) and their word vectors, each listed once
    assert r.stdout.count("features/coco/butd_r101_k36/test.h5") == 1
    assert "glove.840B.300d.txt" in r.stdout
