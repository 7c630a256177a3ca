"""``xmr similarity`` and ``xmr evaluate`` end to end: files in, files out, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from xmr.cli import main

from conftest import imports_torch, run_xmr, run_xmr_imports

ROOT = Path(__file__).resolve().parents[1]

# 2 images x 2 captions each; hand-computed in test_metrics: i2t ranks [0, 1], t2i ranks [0, 1, 1, 0], rsum 500
HAND = np.array([[0.9, 0.1, 0.8, 0.3],
                 [0.2, 0.7, 0.6, 0.5]], dtype=np.float32)


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_xmr(*args, cwd=ROOT)


def test_similarity_subprocess_then_evaluate(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.standard_normal((4, 3, 8)).astype(np.float32)  # 4 images x K=3 sub-embeddings
    caps = rng.standard_normal((8, 8)).astype(np.float32)  # 2 captions per image
    np.save(tmp_path / "I.npy", imgs)
    np.save(tmp_path / "C.npy", caps)
    r = _run("similarity", "--images", str(tmp_path / "I.npy"), "--captions", str(tmp_path / "C.npy"),
             "--measure", "max", "--out", str(tmp_path / "S.npy"))
    assert r.returncode == 0, r.stderr
    s = np.load(tmp_path / "S.npy")
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    expected = np.einsum("nkd,md->nkm", unit(imgs), unit(caps)).max(1)  # max over the K sub-embeddings
    np.testing.assert_allclose(s, expected, atol=1e-6)
    assert s.dtype == np.float32

    assert main(["evaluate", "--sims", str(tmp_path / "S.npy"), "--captions-per-image", "2", "--rerank", "fr",
                 "--rerank-param", "gamma1=30", "--out", str(tmp_path / "M.json")]) == 0
    m = json.loads((tmp_path / "M.json").read_text())
    assert set(m["i2t"]) == {"r1", "r5", "r10", "medr", "meanr"} and "rsum" in m
    assert m["rerank"] == "fr" and m["rerank_params"]["gamma1"] == 30.0 and m["rerank_params"]["gamma2"] == 25.0


def test_evaluate_hand_matrix(tmp_path, capsys):
    np.save(tmp_path / "S.npy", HAND)
    assert main(["evaluate", "--sims", str(tmp_path / "S.npy"), "--captions-per-image", "2",
                 "--out", str(tmp_path / "M.json")]) == 0
    m = json.loads((tmp_path / "M.json").read_text())
    assert m["i2t"] == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.5}
    assert m["t2i"] == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.5}
    assert m["rsum"] == 500.0 and m["protocol"] == "plain" and m["ties"] == "pessimistic"
    assert "rsum 500.0" in capsys.readouterr().out


def test_evaluate_ties_rr_and_cub(tmp_path):
    np.save(tmp_path / "Z.npy", np.zeros((2, 4), np.float32))
    assert main(["evaluate", "--sims", str(tmp_path / "Z.npy"), "--captions-per-image", "2", "--ties", "optimistic",
                 "--out", str(tmp_path / "M.json")]) == 0
    assert json.loads((tmp_path / "M.json").read_text())["i2t"]["r1"] == 100.0  # every tie resolved in favour
    np.save(tmp_path / "S.npy", HAND)
    assert main(["evaluate", "--sims", str(tmp_path / "S.npy"), "--captions-per-image", "2", "--rerank", "rr",
                 "--rerank-param", "t2i_gt_groups=true", "--rerank-param", "k_i2t=2",
                 "--out", str(tmp_path / "R.json")]) == 0
    p = json.loads((tmp_path / "R.json").read_text())["rerank_params"]
    assert p == {"k_i2t": 2, "k_t2i": 20, "t2i_gt_groups": True}  # the results say which variant ran
    # CUB: class labels per image, captions inherit them (see test_metrics for the hand computation)
    s = np.array([[0.9, 0.8, 0.1, 0.3], [0.2, 0.1, 0.7, 0.6]], dtype=np.float32)
    np.save(tmp_path / "C.npy", s)
    np.save(tmp_path / "L.npy", np.array([0, 1]))
    assert main(["evaluate", "--sims", str(tmp_path / "C.npy"), "--protocol", "cub", "--captions-per-image", "2",
                 "--image-labels", str(tmp_path / "L.npy"), "--out", str(tmp_path / "U.json")]) == 0
    u = json.loads((tmp_path / "U.json").read_text())
    # image 0 (class 0): captions 0, 1 relevant, top-2 = {0, 1} -> R-P 1; image 1: captions 2, 3 -> top-2 {2, 3} -> 1
    assert u["i2t"]["r_precision"] == 100.0 and u["i2t"]["r1"] == 100.0
    # captions 0, 1 -> image 0 scores 0.9/0.8 vs 0.2/0.1: hit; caption 2: 0.1 vs 0.7 hit; caption 3: 0.3 vs 0.6 hit
    assert u["t2i"]["r1"] == 100.0 and "rsum" not in u


def _bad(tmp_path, name, array):
    np.save(tmp_path / name, array)
    return str(tmp_path / name)


@pytest.mark.parametrize("case, extra, message", [
    ("nan", [], "similarity matrix contains 1 NaN and 0 inf value(s) (first at row 1, column 2)"),
    ("indivisible", ["--captions-per-image", "3"], "caption count 4 is not divisible by captions-per-image 3"),
    ("protocol", ["--protocol", "f30k"], "protocol f30k needs a 1000 x 5000 matrix (images x captions), got 2 x 4"),
    ("param", ["--captions-per-image", "2", "--rerank", "fr", "--rerank-param", "gamma9=1"],
     "unknown parameter 'gamma9' for re-ranker 'fr'; known: exclude_self, gamma1, gamma2, lambda1, lambda2, pool"),
    ("value", ["--captions-per-image", "2", "--rerank", "fr", "--rerank-param", "gamma1=big"],
     "re-ranker 'fr': parameter gamma1='big' is not a valid float"),
    ("syntax", ["--captions-per-image", "2", "--rerank", "csls", "--rerank-param", "k"],
     "--rerank-param 'k': expected NAME=VALUE"),
    ("missing", ["--captions-per-image", "2"], "not found"),
])
def test_bad_input_one_line_error(tmp_path, capsys, case, extra, message):
    a = HAND.copy()
    if case == "nan":
        a[1, 2] = np.nan
    path = _bad(tmp_path, "S.npy", a) if case != "missing" else str(tmp_path / "absent.npy")
    rc = main(["evaluate", "--sims", path, *extra, "--out", str(tmp_path / "M.json")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == f"xmr evaluate: error: {message}" or (case == "missing" and message in err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "M.json").exists()


def test_bad_input_subprocess_has_no_traceback(tmp_path):
    a = HAND.copy()
    a[0, 0] = np.inf
    r = _run("evaluate", "--sims", _bad(tmp_path, "S.npy", a), "--captions-per-image", "2",
             "--out", str(tmp_path / "M.json"))
    assert r.returncode == 2
    assert r.stderr.strip() == ("xmr evaluate: error: similarity matrix contains 0 NaN and 1 inf value(s) "
                                "(first at row 0, column 0)")


def test_similarity_cli_errors(tmp_path, capsys):
    i = _bad(tmp_path, "I.npy", np.ones((2, 3, 4), np.float32))
    c = _bad(tmp_path, "C.npy", np.ones((4, 4), np.float32))
    assert main(["similarity", "--images", i, "--captions", c, "--out", str(tmp_path / "S.npy")]) == 2
    assert "measure 'cosine' compares single vectors" in capsys.readouterr().err
    c5 = _bad(tmp_path, "C5.npy", np.ones((4, 5), np.float32))
    assert main(["similarity", "--images", i, "--captions", c5, "--measure", "max", "--out", "x.npy"]) == 2
    assert "embedding sizes differ" in capsys.readouterr().err


@pytest.mark.parametrize("measure, extra", [("max", ["--rerank", "fr"]), ("smooth_chamfer", ["--alpha", "4"]),
                                            ("cosine", ["--rerank", "csls"])])
def test_evaluate_embeddings_equals_similarity_then_evaluate_sims(tmp_path, measure, extra):
    """One process, no matrix on disk: exactly the metrics JSON of `xmr similarity` + `xmr evaluate --sims`."""
    rng = np.random.default_rng(1)
    sets = measure != "cosine"
    imgs = rng.standard_normal((4, 3, 8) if sets else (4, 8)).astype(np.float32)
    caps = rng.standard_normal((12, 2, 8) if measure == "smooth_chamfer" else (12, 8)).astype(np.float32)
    i, c = _bad(tmp_path, "I.npy", imgs), _bad(tmp_path, "C.npy", caps)
    embedding = ["--images", i, "--captions", c, "--measure", measure]
    alpha = extra[extra.index("--alpha"):][:2] if "--alpha" in extra else []
    rest = [x for x in extra if x not in alpha]
    common = ["--captions-per-image", "3", *rest]
    assert main(["similarity", *embedding, *alpha, "--out", str(tmp_path / "S.npy")]) == 0
    assert main(["evaluate", "--sims", str(tmp_path / "S.npy"), *common, "--out", str(tmp_path / "A.json")]) == 0
    assert main(["evaluate", *embedding, *alpha, *common, "--out", str(tmp_path / "B.json")]) == 0
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "AB")
    assert a == b and a["rerank"] == (rest[1] if rest else "none")


@pytest.mark.parametrize("inputs, message", [
    (["--sims", "S"], "give either --sims S.npy or --images I.npy --captions C.npy (with --measure), not both"),
    ([], "give --sims S.npy, or --images I.npy --captions C.npy (with --measure)"),
    (["--drop-captions"], "--images given alone: give both --images and --captions"),
    (["--captions-dim", "5"], "embedding sizes differ: images have D=4, captions D=5"),
    (["--captions-rows", "5"], "caption count 5 is not divisible by captions-per-image 2"),
])
def test_evaluate_embeddings_bad_input_one_line(tmp_path, capsys, inputs, message):
    s = _bad(tmp_path, "S.npy", HAND)
    i = _bad(tmp_path, "I.npy", np.ones((2, 3, 4), np.float32))
    dim = int(inputs[1]) if inputs[:1] == ["--captions-dim"] else 4
    rows = int(inputs[1]) if inputs[:1] == ["--captions-rows"] else 4
    c = _bad(tmp_path, "C.npy", np.ones((rows, dim), np.float32))
    args = [] if inputs == [] else ["--images", i] + ([] if inputs == ["--drop-captions"] else ["--captions", c])
    args += ["--sims", s] if inputs[:1] == ["--sims"] else []
    rc = main(["evaluate", *args, "--measure", "max", "--captions-per-image", "2", "--out", str(tmp_path / "M.json")])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == f"xmr evaluate: error: {message}"
    assert not (tmp_path / "M.json").exists()


# -- NumPy files on the CPU: evaluated in NumPy, without importing torch ------------------------------------------

@pytest.mark.parametrize("inputs", [["--images", "I", "--captions", "C", "--measure", "max", "--rerank", "fr"],
                                    ["--images", "I0", "--captions", "C", "--measure", "cosine"],
                                    ["--sims", "S", "--rerank", "fr", "--ties", "index"]])
def test_evaluate_numpy_files_never_import_torch(tmp_path, inputs):
    """torch's import is 1.5 s of a COCO-5K evaluation on the AMD VM and 2.1 s on the Intel one (docs/speed.md):
    the documented command's NumPy files stay in NumPy from the similarity blocks to the ranks."""
    rng = np.random.default_rng(4)
    imgs = rng.standard_normal((6, 3, 8)).astype(np.float32)
    caps = rng.standard_normal((12, 8)).astype(np.float32)
    files = {"I": _bad(tmp_path, "I.npy", imgs), "I0": _bad(tmp_path, "I0.npy", imgs[:, 0]),
             "C": _bad(tmp_path, "C.npy", caps), "S": _bad(tmp_path, "S.npy", rng.random((6, 12), np.float32))}
    _, imported = run_xmr_imports("evaluate", *(files.get(a, a) for a in inputs), "--captions-per-image", "2",
                                  "--out", tmp_path / "M.json", cwd=ROOT)
    assert {"xmr.evaluation.ranks", "xmr.rerank.fast", "numpy"} <= imported  # the log is the whole process's
    assert not imports_torch(imported)
    assert "rsum" in json.loads((tmp_path / "M.json").read_text())


@pytest.mark.parametrize("rerank, params", [(None, {}), ("fr", {}), ("fr", {"gamma1": 9.0, "lambda2": 17.0}),
                                            ("fr", {"pool": "max"}), ("fr", {"exclude_self": True}),
                                            ("csls", {}), ("dsl", {}), ("rr", {})])
@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "index"])
def test_numpy_matrix_ranks_as_its_tensor(rerank, params, ties):
    """The evaluator on a NumPy matrix (NumPy kernels, or a tensor view for re-rankers without NumPy ones) gives
    exactly the metrics of the same matrix as a tensor; scores rounded to 1/16 make ties for every tie policy."""
    import torch

    from xmr.evaluation import evaluate_sims

    rng = np.random.default_rng(5)
    sims = np.round(rng.random((40, 120)) * 16).astype(np.float32) / 16  # 17 levels: ties in every row
    kw = dict(captions_per_image=3, rerank=rerank, rerank_params=params, ties=ties, block_bytes=4096)
    a = evaluate_sims(sims, **kw)
    b = evaluate_sims(torch.from_numpy(sims.copy()), **kw)
    assert a == b
    assert a["rerank"] == (rerank or "none")


def test_numpy_coco1k_folds_rank_as_tensor_folds():
    """COCO 1K's five folds are column/row slices of the 5K matrix: non-contiguous NumPy views, ranked alike."""
    import torch

    from xmr.evaluation import evaluate_sims

    sims = np.random.default_rng(6).standard_normal((5000, 25000), dtype=np.float32)
    sims[np.arange(5000), np.arange(0, 25000, 5)] += 3.0  # each image's first caption ranks high
    a = evaluate_sims(sims, protocol="coco1k", rerank="fr")
    b = evaluate_sims(torch.from_numpy(sims), protocol="coco1k", rerank="fr")
    assert a == b and len(a["folds"]) == 5 and a["i2t"]["r10"] > 50.0


def test_compute_similarity_numpy_in_numpy_out():
    """NumPy inputs give a NumPy matrix (cosine/max/mean in NumPy, the other measures through torch), equal to the
    tensor path to float32 rounding: |difference| <= 2 ulp of 1 plus 4 ulp of the value (log_match_prob's values
    reach -40, where one ulp is 4e-6; the BLAS kernels a CPU picks round such sums differently)."""
    import torch

    from xmr.similarity.measures import compute_similarity

    rng = np.random.default_rng(7)
    imgs = rng.standard_normal((7, 3, 16)).astype(np.float32)
    caps = rng.standard_normal((9, 16)).astype(np.float32)
    for measure, x in (("cosine", imgs[:, 0]), ("max", imgs), ("mean", imgs), ("chamfer", imgs),
                       ("log_match_prob", imgs)):
        got = compute_similarity(x, caps, measure, chunk_size=2, block_bytes=256)
        ref = compute_similarity(torch.from_numpy(x), torch.from_numpy(caps), measure).numpy()
        assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == (7, 9)
        eps = np.finfo(np.float32).eps
        np.testing.assert_allclose(got, ref, rtol=4 * eps, atol=2 * eps, err_msg=measure)
    assert isinstance(compute_similarity(imgs, caps, "max", device="cpu"), np.ndarray)
    t = compute_similarity(torch.from_numpy(imgs), caps, "max")
    assert isinstance(t, torch.Tensor)  # a tensor in: a tensor out


def test_similarity_with_set_elements_left_out_by_hand(tmp_path, capsys):
    """DivE Table 5's ablated evaluation: `xmr similarity --image-elements / --drop-image-elements` (and the caption
    side) score with only some elements of each set; max over unit vectors worked out by hand."""
    np.save(tmp_path / "I.npy", np.array([[[1.0, 0.0], [0.0, 1.0]]], dtype=np.float32))  # 1 image, K = 2
    np.save(tmp_path / "C.npy", np.array([[1.0, 0.0], [0.6, 0.8]], dtype=np.float32))  # 2 single captions
    base = ["similarity", "--images", str(tmp_path / "I.npy"), "--captions", str(tmp_path / "C.npy"),
            "--measure", "max", "--out", str(tmp_path / "S.npy")]

    def sims(*extra: str) -> list[float]:
        assert main([*base, *extra]) == 0
        return np.load(tmp_path / "S.npy")[0].tolist()

    assert sims() == pytest.approx([1.0, 0.8])  # max(1, 0), max(0.6, 0.8)
    assert sims("--image-elements", "0") == pytest.approx([1.0, 0.6])  # only S^V(1) = (1, 0)
    assert sims("--drop-image-elements", "0") == pytest.approx([0.0, 0.8])  # only (0, 1) left
    # caption sets: one image (0.6, 0.8) against a caption set {(1, 0), (0, 1)}
    np.save(tmp_path / "I.npy", np.array([[0.6, 0.8]], dtype=np.float32))
    np.save(tmp_path / "C.npy", np.array([[[1.0, 0.0], [0.0, 1.0]]], dtype=np.float32))
    assert sims() == pytest.approx([0.8])
    assert sims("--caption-elements", "0") == pytest.approx([0.6])
    assert sims("--drop-caption-elements", "1") == pytest.approx([0.6])
    capsys.readouterr()
    # an index past the set, every element dropped, or single vectors: one line naming the fix, exit 2
    assert main([*base, "--caption-elements", "2"]) == 2
    assert "caption elements [2]: give distinct 0-based indices of the 2 set elements (0 to 1)" in capsys.readouterr().err
    assert main([*base, "--drop-caption-elements", "0", "1"]) == 2
    assert "leaves nothing to score; keep at least one" in capsys.readouterr().err
    assert main([*base, "--image-elements", "0"]) == 2
    assert "image embeddings are single vectors (1, 2), not sets" in capsys.readouterr().err
