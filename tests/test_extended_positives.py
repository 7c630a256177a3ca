"""ECCV Caption / CxC protocols and extended positives: xmr's numbers against the eccv-caption package's own
``Metrics`` (run here on the same retrieved lists), a case worked out by hand, synth's scene-checked positives and
the one-line errors."""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from xmr.core.errors import XmrError
from xmr.data.synth import caption_true_of, generate_synth, scene_positives
from xmr.evaluation import evaluate_sims
from xmr.evaluation.extended import ExtendedPositives, Positives, positives_from_caption_lists

from conftest import run_xmr

ROOT = Path(__file__).resolve().parents[1]
ECCV_KEYS = {"map_at_r": "eccv_map_at_r", "r_precision": "eccv_rprecision", "r1": "eccv_r1"}


@functools.lru_cache(maxsize=1)
def _package():
    """One eccv_caption.Metrics for the small cases, whose positives they set (it reads all its annotation files
    when made)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the package warns that ujson is missing
        from eccv_caption import Metrics
    return Metrics()


def _package_metrics(tmp_path: Path, i2t_gt: dict, t2i_gt: dict, i2t_lists: dict, t2i_lists: dict) -> dict:
    """eccv_caption.Metrics with ``i2t_gt``/``t2i_gt`` as its ECCV Caption and CxC positives (through its own
    set_*_gts file API), on the given retrieved lists."""
    for name, gt in (("i2t", i2t_gt), ("t2i", t2i_gt)):
        (tmp_path / f"{name}.json").write_text(json.dumps({str(k): [int(x) for x in v] for k, v in gt.items()}))
    metrics = _package()
    metrics.set_eccv_gts(tmp_path / "i2t.json", tmp_path / "t2i.json")
    metrics.set_cxc_gts(tmp_path / "i2t.json", tmp_path / "t2i.json")
    return metrics.compute_all_metrics(i2t_lists, t2i_lists, target_metrics=(
        "eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_recalls"), Ks=(1, 5, 10))


def _retrieved(s: np.ndarray, gt: dict, ties: str) -> dict:
    """Each query's gallery sorted by decreasing score, ties placed as the tie policy says."""
    out = {}
    gallery = np.arange(s.shape[1])
    for q, pos in gt.items():
        relevant = np.isin(gallery, pos)
        second = {"pessimistic": relevant, "optimistic": ~relevant, "index": gallery}[ties]
        out[q] = np.lexsort((gallery, second, -s[q])).tolist()
    return out


def _assert_same(ours: dict, theirs: dict, tol: float = 1e-9) -> None:
    for d in ("i2t", "t2i"):
        for key, ref in ECCV_KEYS.items():
            assert ours["extended"][d][key] == pytest.approx(100 * theirs[ref][d], abs=tol), (d, key)
        for k in (1, 5, 10):
            assert ours["cxc"][d][f"r{k}"] == pytest.approx(100 * theirs[f"cxc_r{k}"][d], abs=tol), (d, k)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "index"])
def test_random_matrices_with_ties_equal_the_package(tmp_path, ties):
    from xmr.evaluation.extended import extended_metrics, recall_at_k
    from xmr.rerank import Rescoring

    rng = np.random.default_rng(7)
    for trial in range(6):
        n, m = 9, 17
        s = rng.integers(0, 4, (n, m)).astype(np.float32)  # four values: ties everywhere
        i2t = {i: sorted(rng.choice(m, rng.integers(1, 6), replace=False).tolist()) for i in range(n) if rng.random() < .8}
        t2i = {j: sorted(rng.choice(n, rng.integers(1, 4), replace=False).tolist()) for j in range(m) if rng.random() < .8}
        pos = ExtendedPositives("random", Positives.from_lists(list(i2t), list(i2t.values())),
                                Positives.from_lists(list(t2i), list(t2i.values())))
        ours = {"extended": extended_metrics(Rescoring(s), pos, ties), "cxc": recall_at_k(Rescoring(s), pos, ties)}
        theirs = _package_metrics(tmp_path, i2t, t2i, _retrieved(s, i2t, ties), _retrieved(s.T, t2i, ties))
        _assert_same(ours, theirs)


def test_hand_worked_case():
    # 2 images x 2 captions. Image 0 is also shown by caption 2, caption 2 is true of both images.
    s = np.array([[0.9, 0.1, 0.8, 0.8],
                  [0.2, 0.7, 0.6, 0.5]], dtype=np.float32)
    pos = positives_from_caption_lists([[0], [0], [0, 1], [1]], 2, "hand")
    assert pos.i2t.items.tolist() == [[0, 1, 2], [2, 3, -1]]
    pes = evaluate_sims(s, "plain", 2, positives=pos)["extended"]
    # image 0, R=3: c0 first; c3 (0.8, irrelevant) before the tied c2 (pessimistic) -> positives at 1, 3, 4:
    # AP = (1/1 + 2/3) / 3 = 5/9, R-P = 2/3. Image 1, R=2: c1 0.7, c2 0.6, c3 0.5 -> positives at 2, 3:
    # AP = (1/2) / 2 = 1/4, R-P = 1/2, R@1 = 0.
    assert pes["i2t"]["map_at_r"] == pytest.approx(100 * (5 / 9 + 1 / 4) / 2)
    assert pes["i2t"]["r_precision"] == pytest.approx(100 * (2 / 3 + 1 / 2) / 2)
    assert pes["i2t"]["r1"] == pytest.approx(50.0)
    # captions: c0 -> image 0 first (1); c1 -> image 0 second, R=1 (0); c2 -> both, in order (1); c3 -> image 1
    # second (0 scores 0.8 > 0.5), R=1 (0)
    assert pes["t2i"] == pytest.approx({"map_at_r": 50.0, "r_precision": 50.0, "r1": 50.0})
    opt = evaluate_sims(s, "plain", 2, positives=pos, ties="optimistic")["extended"]
    # optimistic: c2 before c3 -> image 0's positives at 1, 2, 4: AP = (1 + 1) / 3
    assert opt["i2t"]["map_at_r"] == pytest.approx(100 * (2 / 3 + 1 / 4) / 2)


def test_synth_positives_checked_by_hand(tmp_path):
    ann = generate_synth(tmp_path / "synth", seed=3, n_train=1, n_val=1, n_test=60, image_size=128, progress=False)
    test = [e for e in json.loads(ann.read_text())["images"] if e["split"] == "test"]
    size = 128.0
    checked = 0
    for e in test[:6]:  # every other image, one by one, against the stored list
        for sent in e["sentences"]:
            truth = [o["imgid"] for o in test if o is not e and caption_true_of(sent["semantics"], o["objects"], size)]
            assert sent.get("positives", []) == truth
            checked += bool(truth)
    # a caption true of another image: its objects are in that image's scene record
    shared = next(s for e in test for s in e["sentences"] if s.get("positives"))
    other = next(o for o in test if o["imgid"] == shared["positives"][0])
    for spec in shared["semantics"]["objects"]:
        assert any(all(o[k] == spec[k] for k in ("shape", "colour", "size") if k in spec) for o in other["objects"])
    assert scene_positives(test[:1], size) == [[[] for _ in test[0]["sentences"]]]  # alone: no other image


def test_caption_true_of_two_images_scores_r1_on_either():
    # caption 0 is true of images 0 and 1; whichever image the model puts first, R@1 = 1 under extended positives
    pos = positives_from_caption_lists([[0, 1], [0], [1], [1]], 2, "two")
    for first in (0, 1):
        s = np.full((2, 4), 0.1, dtype=np.float32)
        s[first, 0] = 0.9
        s[0, 1] = s[1, 2] = s[1, 3] = 0.5
        ext = evaluate_sims(s, "plain", 2, positives=pos)["extended"]
        r = evaluate_sims(s, "plain", 2)
        assert ext["t2i"]["r1"] == 100.0  # every caption's first image is one of its positives
        assert r["t2i"]["r1"] == (100.0 if first == 0 else 75.0)  # R@K counts image 1 for caption 0 as a miss


P, A, B = 25013, 7919, 4703  # P prime: (A·i + B·j) mod P differs between any two rows of a column / columns of a row


def _coco_matrix(tmp_path: Path) -> tuple[Path, dict[tuple[int, int], bool]]:
    """A 5000 x 25000 matrix with no tie in any row or column: the residue (A·i + B·j) mod P, plus P on each image's
    own captions and on one ECCV positive of every other caption query (the "lifted" entries), so that the metrics
    are far from zero. Returns its file and the lifted entries."""
    from xmr.data.coco_positives import coco_positives

    s = np.add.outer(((A * np.arange(5000)) % P).astype(np.float32), ((B * np.arange(25000)) % P).astype(np.float32))
    np.subtract(s, P, out=s, where=s >= P)  # integers below 2P: exact in float32
    t2i = coco_positives("eccv").t2i
    lifted = set(zip(np.repeat(np.arange(5000), 5).tolist(), range(25000)))
    lifted |= set(zip(t2i.items[::2, 0].tolist(), t2i.queries[::2].tolist()))
    rows, cols = np.asarray(sorted(lifted)).T
    s[rows, cols] += P
    path = tmp_path / "S.npy"
    np.save(path, s)
    return path, lifted


def _top_lists(lifted: set, ids_q, ids_g, width: int, columns: bool = False) -> dict:
    """Each query's top ``width`` gallery ids, best first, worked out from the matrix's construction (not by
    sorting it): its lifted entries by residue, then the others by decreasing residue, i.e. the gallery index
    whose residue is P-1, P-2, ... All the package reads for R@10, and for mAP@R with R <= width."""
    n_q, n_g = (25000, 5000) if columns else (5000, 25000)
    step, other = (A, B) if columns else (B, A)  # residue = other·q + step·g (mod P)
    inverse = pow(step, -1, P)
    out = {}
    mine: dict[int, list[int]] = {}  # each query's lifted gallery items
    for i, j in lifted:
        q, g = (j, i) if columns else (i, j)
        mine.setdefault(q, []).append(g)
    scan = width + 20 if not columns else 8 * width  # residues read per query: enough valid items (asserted)
    residues = np.arange(P - 1, P - 1 - scan, -1)
    gal = ((residues[None, :] - other * np.arange(n_q)[:, None]) * inverse) % P  # each residue's item, best first
    own = np.full((n_q, max(len(v) for v in mine.values())), -1)
    for qq, gs in mine.items():
        own[qq, :len(gs)] = gs
    valid = (gal < n_g) & ~(gal[:, :, None] == own[:, None, :]).any(-1)
    assert valid.sum(1).min() >= width
    first = np.argsort(~valid, axis=1, kind="stable")[:, :width]
    rest = np.take_along_axis(gal, first, 1)
    for qq in range(n_q):
        top = sorted(mine.get(qq, []), key=lambda g: -((other * qq + step * g) % P)) + rest[qq].tolist()
        out[int(ids_q[qq])] = ids_g[top[:width]].tolist()
    return out


@pytest.mark.slow
def test_cli_eccv_and_cxc_equal_the_package_on_coco_5k(tmp_path):
    from xmr.data.coco_positives import coco_test_order

    path, lifted = _coco_matrix(tmp_path)
    out = {}
    for protocol in ("eccv", "cxc"):
        r = run_xmr("evaluate", "--sims", path, "--protocol", protocol, "--out", tmp_path / f"{protocol}.json",
                    cwd=ROOT)
        assert r.returncode == 0, r.stderr
        out[protocol] = json.loads((tmp_path / f"{protocol}.json").read_text())
        assert ("mAP@R" if protocol == "eccv" else "CxC i2t R@1/5/10") in r.stdout
    images, captions = coco_test_order()
    width = 64  # above every ECCV query's R (48 at most) and 10
    package = type(_package())()  # a fresh one, with its own COCO annotations
    theirs = package.compute_all_metrics(_top_lists(lifted, images, captions, width),
                                         _top_lists(lifted, captions, images, width, columns=True),
                                         target_metrics=("eccv_map_at_r", "eccv_rprecision", "eccv_r1",
                                                         "cxc_recalls"), Ks=(1, 5, 10))
    assert 0.1 < theirs["eccv_map_at_r"]["t2i"] < 0.9  # a matrix that tells the metrics apart
    # the results file holds 3 decimals
    _assert_same({"extended": out["eccv"]["extended"], "cxc": out["cxc"]["cxc"]}, theirs, tol=1e-3)
    assert out["eccv"]["extended"]["positives"] == "eccv_caption"
    assert out["eccv"]["rsum"] == out["cxc"]["rsum"]  # beside COCO 5K's R@K


def test_bad_input_is_one_line(tmp_path):
    np.save(tmp_path / "small.npy", np.zeros((10, 50), np.float32))
    r = run_xmr("evaluate", "--sims", tmp_path / "small.npy", "--protocol", "eccv", "--out", tmp_path / "m.json",
                cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "needs a 5000 x 25000 matrix" in r.stderr
    s = np.lib.format.open_memmap(tmp_path / "S.npy", "w+", np.float32, (5000, 25000))  # zeros, written lazily
    s.flush()
    (tmp_path / "rows.txt").write_text("\n".join(str(k) for k in range(5000)) + "\n")  # row numbers, not COCO ids
    r = run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--protocol", "eccv", "--image-ids", tmp_path / "rows.txt",
                "--out", tmp_path / "m.json", cwd=ROOT)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "of the 5000 image ids are COCO 5K test images" in r.stderr and "--image-ids" in r.stderr
    from xmr.data.coco_positives import coco_positives, coco_test_order

    images, captions = coco_test_order()
    swapped = images.copy()
    swapped[3] = 1  # not a test image
    with pytest.raises(XmrError, match=r"image id 1 \(row 3\) is not one of the COCO 5K test images"):
        coco_positives("eccv", swapped)
    caps = captions.copy()
    caps[[0, 5]] = caps[[5, 0]]  # caption 0 under image 1's row
    with pytest.raises(XmrError, match=rf"caption id {caps[0]} \(column 0\) is not a COCO 5K test caption of image"):
        coco_positives("cxc", images, caps)
    with pytest.raises(XmrError, match="protocol cxc scores the cxc positives: pass positives="):
        evaluate_sims(s, "cxc", positives=coco_positives("eccv"))
    r = run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--protocol", "coco5k", "--image-ids", tmp_path / "rows.txt",
                "--out", tmp_path / "m.json", cwd=ROOT)
    assert r.returncode == 2 and "--image-ids orders the matrix for --protocol eccv or cxc only" in r.stderr


def test_row_order_from_ids_permutes_the_positives():
    # the same scores with rows and columns listed in another order give the same numbers
    from xmr.data.coco_positives import coco_positives, coco_test_order

    images, captions = coco_test_order()
    perm = np.random.default_rng(0).permutation(5000)
    ref, moved = coco_positives("eccv"), coco_positives("eccv", images[perm])
    col_perm = (perm[:, None] * 5 + np.arange(5)).reshape(-1)  # new column k holds old column col_perm[k]
    old_of_row = dict(zip(range(5000), perm))
    row = dict(zip(ref.i2t.queries.tolist(), ref.i2t.items.tolist()))
    for q, items in zip(moved.i2t.queries[:50].tolist(), moved.i2t.items[:50].tolist()):
        assert sorted(col_perm[x] for x in items if x >= 0) == [x for x in row[old_of_row[q]] if x >= 0]


def test_xmr_test_on_synth_reports_extended_positives_whole_split_and_subsets(tiny_synth, tiny_synth_run, tmp_path):
    """`xmr test` on a synth run: `extended` (synth_scenes) beside R@K, and per subset, equal to the evaluator given
    positives worked out here from the scene records with caption_true_of."""
    doc = json.loads((tiny_synth.root / "data" / "synth" / "dataset_synth.json").read_text())
    test = [e for e in doc["images"] if e["split"] == "test"]
    lists = [[k for k, o in enumerate(test) if caption_true_of(s["semantics"], o["objects"], doc["image_size"])]
             for e in test for s in e["sentences"][:5]]
    assert all(j // 5 in pos for j, pos in enumerate(lists))  # a caption is true of its own image
    sims = np.random.default_rng(1).random((len(test), 5 * len(test)), dtype=np.float32)
    np.save(tmp_path / "S.npy", sims)
    run_xmr("test", "--run", tiny_synth_run, "--sims", tmp_path / "S.npy", "--no-tracking",
            "--out", tmp_path / "r.json", check=True)
    got = json.loads((tmp_path / "r.json").read_text())
    subsets = {"ambiguous": {"images": np.asarray(["ambiguous" in e.get("subsets", []) for e in test]),
                             "captions": np.asarray(["ambiguous" in s.get("subsets", []) for e in test
                                                     for s in e["sentences"][:5]])}}
    want = evaluate_sims(sims, "plain", 5, positives=positives_from_caption_lists(lists, len(test), "synth_scenes"),
                         subsets=subsets)
    assert got["extended"]["positives"] == "synth_scenes"
    for d in ("i2t", "t2i"):
        assert got["extended"][d] == pytest.approx(want["extended"][d], abs=1e-3)
        assert got["subsets"]["ambiguous"]["extended"][d] == pytest.approx(
            want["subsets"]["ambiguous"]["extended"][d], abs=1e-3, nan_ok=True)


def test_benchmark_records_read_extended_map_at_r_beside_rsum():
    from xmr.studies.benchmark import flat_metrics

    rec = {"r1": 1.0, "r5": 2.0, "r10": 3.0}
    result = {"i2t": rec, "t2i": rec, "rsum": 12.0,
              "extended": {"positives": "synth_scenes", "i2t": {"map_at_r": 40.0}, "t2i": {"map_at_r": 30.0}},
              "subsets": {"ambiguous": {"i2t": rec, "t2i": rec, "rsum": 12.0}}}
    flat = flat_metrics(result)
    assert (flat["all"]["i2t_map_at_r_ext"], flat["all"]["t2i_map_at_r_ext"]) == (40.0, 30.0)
    assert np.isnan(flat["ambiguous"]["t2i_map_at_r_ext"])  # a subset without extended metrics: NaN, not a crash


def test_report_shows_eccv_and_cxc_beside_dive_table_a1(tmp_path):
    """The report's COCO table: under protocol eccv, xmr's ECCV Caption and CxC numbers, and DiVE Table A1's row in
    the same columns (xmr/report/paper_results.yaml)."""
    from xmr.report.build import results_section

    rec = {"r1": 50.0, "r5": 80.0, "r10": 90.0}
    base = {"i2t": rec, "t2i": rec, "rsum": 440.0}
    eccv = base | {"protocol": "eccv", "extended": {"positives": "eccv_caption",
                                                    "i2t": {"map_at_r": 30.0, "r_precision": 40.0, "r1": 70.0},
                                                    "t2i": {"map_at_r": 45.0, "r_precision": 55.0, "r1": 85.0}}}
    cxc = base | {"protocol": "cxc", "cxc": {"i2t": {"r1": 60.0, "r5": 85.0, "r10": 92.0},
                                             "t2i": {"r1": 45.0, "r5": 75.0, "r10": 84.0}}}
    path = tmp_path / "results" / "coco" / "dive.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(eccv | {"protocols": {"eccv": eccv, "cxc": cxc}, "dataset": "coco", "recipe": "dive",
                                       "method": "dive", "rerank": "none"}))
    sec, _ = results_section("coco", {"rerank": ["none"]}, ["dive"], tmp_path / "results", tmp_path / "runs")
    tables = [b for b in sec.blocks if b.kind == "table"]
    (eccv_table,) = [t for t in tables if "i2t R-P (ext.)" in t.columns]
    cols = eccv_table.columns
    ours, paper = eccv_table.rows[0], eccv_table.rows[1]
    assert [ours[cols.index(c)] for c in ("i2t mAP@R (ext.)", "t2i R@1 (ext.)")] == ["30.0", "85.0"]
    assert [paper[cols.index(c)] for c in ("i2t mAP@R (ext.)", "i2t R-P (ext.)", "t2i R@1 (ext.)")] == [
        "36.0", "46.4", "91.6"]  # DiVE supplement Table A1, "Ours"
    (cxc_table,) = [t for t in tables if "i2t CxC R@1" in t.columns and t is not eccv_table]
    assert cxc_table.rows[0][cxc_table.columns.index("t2i CxC R@10")] == "84.0"
    assert cxc_table.rows[1][cxc_table.columns.index("i2t CxC R@1")] == "72.3"


def test_a_datasets_own_positives_in_the_karpathy_json(tmp_path):
    """docs/datasets.md: `sentences[].positives` names other images by id; ids outside the split are skipped, a
    sentence without the key keeps its own image only."""
    from xmr.data.karpathy import read_karpathy_split

    def image(name: str, split: str, positives: list | None = None) -> dict:
        first = {"raw": f"a caption of {name}"} | ({} if positives is None else {"positives": positives})
        return {"filename": name, "split": split, "sentences": [first, {"raw": f"another one of {name}"}]}

    doc = {"images": [image("a.jpg", "test", ["c.jpg", "t.jpg"]), image("b.jpg", "test"), image("c.jpg", "test", []),
                      image("t.jpg", "train")]}
    (tmp_path / "d.json").write_text(json.dumps(doc))
    split = read_karpathy_split({"name": "mine", "annotations": str(tmp_path / "d.json"), "images": str(tmp_path),
                                 "captions_per_image": 2, "positives_source": "mine"}, "test")
    assert split.extra["positives"] == {"source": "mine", "t2i": [[0, 2], [0], [1], [1], [2], [2]]}
    pos = positives_from_caption_lists(split.extra["positives"]["t2i"], 3, "mine")
    # image c.jpg (row 2): its own captions 4, 5 and caption 0, which lists it
    assert pos.i2t.items.tolist() == [[0, 1, -1], [2, 3, -1], [0, 4, 5]] and pos.i2t.n_relevant.tolist() == [2, 2, 3]


def test_show_puts_eccv_map_at_r_beside_a_coco_headline(tmp_path):
    """`xmr show` of a COCO results file (headline coco1k): the mAP@R (ext.) columns are its eccv protocol's."""
    rec = {"r1": 50.0, "r5": 80.0, "r10": 90.0}
    base = {"i2t": rec, "t2i": rec, "rsum": 440.0}
    eccv = base | {"extended": {"positives": "eccv_caption", "i2t": {"map_at_r": 33.33, "r_precision": 1.0, "r1": 1.0},
                                "t2i": {"map_at_r": 44.44, "r_precision": 1.0, "r1": 1.0}}}
    (tmp_path / "r.json").write_text(json.dumps(base | {"protocol": "coco1k", "protocols": {
        "coco1k": base, "coco5k": base, "eccv": eccv}, "dataset": "coco", "recipe": "dive", "rerank": "none"}))
    r = run_xmr("show", tmp_path / "r.json", cwd=ROOT, check=True)
    head, _, row = r.stdout.splitlines()[:3]
    cells = dict(zip([c.strip() for c in head.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert (cells["protocol"], cells["i2t mAP@R (ext.)"], cells["t2i mAP@R (ext.)"]) == ("coco1k", "33.3", "44.4")
