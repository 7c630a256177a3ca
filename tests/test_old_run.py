"""A run directory written by the previous release (tests/fixtures/old_run/, made by make_old_run.py at commit
d97c733) loads, scores, evaluates and searches with this version, through the CLI lines a user types; its
config.yaml is re-validated against today's schema, so a key added since the run was written gets its default and
a retired one (``text.hidden_dim``) is dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import imports_torch, run_xmr, run_xmr_imports

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "old_run" / "vsepp"
WRITTEN_AT = "/tmp/bitcheck/data"  # the data root the old run was trained on (make_old_run.py)
QUERY = "a large red square below a small white square"  # caption 1 of test image 0


@pytest.fixture
def old_run(tiny_synth, tmp_path) -> Path:
    """The old run directory, pointed at tiny_synth's copy of the same data, with ``eval.rerank`` (a key added
    after some run directories were written) removed from its config.yaml."""
    run = tmp_path / "vsepp"
    shutil.copytree(FIXTURE, run)
    text = (run / "config.yaml").read_text()
    assert WRITTEN_AT in text and "\n  rerank: {}\n" in text
    assert "\ntext:\n  hidden_dim: 32\n" in text  # a key since retired (it set nothing): the loader drops it
    text = text.replace(WRITTEN_AT, str(tiny_synth.root)).replace("\n  rerank: {}\n", "\n")
    (run / "config.yaml").write_text(text)
    return run


def test_old_run_scores_as_it_did_when_written(old_run, tmp_path):
    run_xmr("score", "--run", old_run, "--out", tmp_path / "sims.npy", "--device", "cpu", "--no-progress",
            check=True)
    written = np.load(FIXTURE / "test_sims.npy")  # the old release's own test matrix
    assert written.shape == (12, 60)
    np.testing.assert_allclose(np.load(tmp_path / "sims.npy"), written, atol=1e-5)


def recall_at_1(sims: np.ndarray) -> tuple[float, float]:
    """i2t and t2i R@1 (%) of an images x captions matrix with 5 captions per image, caption j of image j // 5."""
    caption_image = np.arange(sims.shape[1]) // 5
    i2t = np.mean(caption_image[sims.argmax(axis=1)] == np.arange(sims.shape[0]))
    t2i = np.mean(sims.argmax(axis=0) == caption_image)
    return 100 * i2t, 100 * t2i


def test_old_run_evaluates_plain_and_re_ranked(old_run, tmp_path):
    sims = FIXTURE / "test_sims.npy"
    run_xmr("test", "--run", old_run, "--sims", sims, "--out", tmp_path / "plain.json", "--no-tracking", check=True)
    plain = json.loads((tmp_path / "plain.json").read_text())
    i2t, t2i = recall_at_1(np.load(sims))
    # results files hold metrics rounded to 3 decimals (xmr.run.results.METRIC_DECIMALS)
    assert plain["protocols"]["plain"]["i2t"]["r1"] == round(i2t, 3)
    assert plain["protocols"]["plain"]["t2i"]["r1"] == round(t2i, 3)
    # a re-ranker reads eval.rerank, which this config.yaml lacks (the previous version: KeyError: 'rerank')
    r = run_xmr("test", "--run", old_run, "--sims", sims, "--rerank", "fr", "--out", tmp_path / "fr.json",
                "--no-tracking")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads((tmp_path / "fr.json").read_text())["rerank"] == "fr"


def test_xmr_test_of_a_saved_matrix_never_imports_torch(old_run, tmp_path):
    """Evaluating a saved matrix is NumPy's work (the ranks, FR, the spread): torch's import would be most of the
    command's 2-4 s (docs/evaluation.md)."""
    _, imported = run_xmr_imports("test", "--run", old_run, "--sims", FIXTURE / "test_sims.npy", "--rerank", "fr",
                                  "--out", tmp_path / "fr.json", "--no-tracking")
    assert {"xmr.evaluation.spread", "xmr.rerank.fast"} <= imported and not imports_torch(imported)
    assert json.loads((tmp_path / "fr.json").read_text())["similarity_spread"]["std"] > 0


def test_old_run_searches(old_run):
    r = run_xmr("search", "--run", old_run, "--text", QUERY, "--k", "12", "--device", "cpu", check=True)
    lines = r.stdout[r.stdout.index("query: "):].strip().splitlines()
    assert lines[0].startswith(f"query: {QUERY}")
    scores = [float(line.split()[1]) for line in lines[1:]]
    # the caption's column of the old release's matrix, best first (printed with 4 decimals)
    np.testing.assert_allclose(scores, np.sort(np.load(FIXTURE / "test_sims.npy")[:, 1])[::-1], atol=1e-4)
    r = run_xmr("search", "--run", old_run, "--text", QUERY, "--k", "3", "--rerank", "fr", "--device", "cpu")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_config_yaml_with_a_key_no_version_knows_is_one_line(old_run, tmp_path):
    cfg = old_run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("\neval:\n", "\neval:\n  rerank_typo: 1\n"))
    r = run_xmr("test", "--run", old_run, "--sims", FIXTURE / "test_sims.npy", "--out", tmp_path / "r.json",
                "--no-tracking")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{cfg}: unknown key 'eval.rerank_typo'" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "r.json").exists()
