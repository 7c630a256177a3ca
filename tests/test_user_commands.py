"""Documented commands run as a user types them (``run_xmr``: a fresh ``python -m xmr``
process), each checked for what the text beside it promises."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import numpy as np
import pytest
import yaml

from conftest import REPO, run_xmr, xmr_env


def _one_line_error(r: subprocess.CompletedProcess, command: str) -> str:
    """The command failed with exactly one line on stderr, naming itself, and no traceback."""
    assert r.returncode != 0, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"xmr {command}: error: "), lines[0]
    return lines[0]


def test_show_reads_evaluate_output_and_rejects_other_files_in_one_line(tmp_path):
    # a 2-image x 10-caption matrix whose ranking is worked out by hand: image 0's captions are 0-4, image 1's 5-9;
    # image 0 ranks its own captions first (R@1 100), image 1 ranks caption 0 first, then its own (R@1 0, R@5 100)
    sims = np.full((2, 10), 0.1, dtype=np.float32)
    sims[0, :5] = [0.9, 0.8, 0.7, 0.6, 0.5]
    sims[1, 5:] = [0.6, 0.5, 0.4, 0.3, 0.2]
    sims[1, 0] = 0.95
    np.save(tmp_path / "S.npy", sims)
    run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--out", tmp_path / "M.json", check=True)
    r = run_xmr("show", tmp_path / "M.json", check=True)
    row = r.stdout.splitlines()[2].split(" | ")
    assert row[1:4] == ["M", "plain", "50.0"], r.stdout  # i2t R@1: image 0 hits, image 1 misses
    (tmp_path / "train.json").write_text(json.dumps({"best_epoch": 3, "best_val_rsum": 100.0}))  # no history
    for bad, says in (("S.npy", "not a JSON file"), ("train.json", "a train.json without its epochs"),
                      ("missing.json", "file not found")):
        line = _one_line_error(run_xmr("show", tmp_path / bad), "show")
        assert says in line and bad in line, line
    # a folder stands for its results files, by name; the other files in it (train.json, S.npy) are left out
    (tmp_path / "N.json").write_text((tmp_path / "M.json").read_text())
    r = run_xmr("show", tmp_path, check=True)
    assert [ln.split(" | ")[1] for ln in r.stdout.splitlines()[2:4]] == ["M", "N"], r.stdout
    # 2 images: t2i R@5 and R@10 cannot miss; 10 captions, 5 each: nor can i2t R@10 (said once, under the table)
    assert r.stdout.splitlines()[4:] == ["note: R@K with K >= the gallery's size is 100 by construction: i2t R@10 "
                                         "(10 captions, 5 per image); t2i R@5, R@10 (2 images) (in M, N)"]
    (tmp_path / "empty").mkdir()
    line = _one_line_error(run_xmr("show", tmp_path / "empty"), "show")
    assert line.startswith(f"xmr show: error: {tmp_path / 'empty'}: no results files in this folder"), line


def test_show_prints_how_a_run_trained_epoch_by_epoch(tiny_synth_run):
    """`xmr show runs/DATASET/RECIPE` (README): the run's summary line, then one row per epoch of its train.json."""
    summary = json.loads((tiny_synth_run / "train.json").read_text())
    r = run_xmr("show", tiny_synth_run, check=True)
    lines = r.stdout.splitlines()
    assert lines[0] == (f"{tiny_synth_run}: dvse (recipe dvse_docs) on synth, 1 epoch(s) of at most "
                        f"{summary['max_epochs']}, ended by {summary['stopped_by']}; best validation RSUM "
                        f"{summary['best_val_rsum']:.1f} at epoch 1; {summary['train_seconds']:.0f} s of training")
    assert lines[2] == "| epoch | loss | lr | val RSUM | val sim. std | seconds |"
    (h,) = summary["history"]  # the conftest's run trains one epoch
    assert lines[4].split(" | ")[:4] == ["| 1", f"{h['loss']:.4f}", f"{h['lr']:.3g}", f"{h['val_rsum']:.1f}"]
    assert len(lines) == 5
    assert run_xmr("show", tiny_synth_run / "train.json", check=True).stdout == r.stdout  # the file, the same


def test_show_prints_a_training_run_from_its_history(tiny_synth_run, tmp_path):
    """A run directory without train.json yet (written when training ends): the epochs of its history.csv."""
    import shutil

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(tiny_synth_run / "history.csv", run / "history.csv")
    (h,) = json.loads((tiny_synth_run / "train.json").read_text())["history"]
    lines = run_xmr("show", run, check=True).stdout.splitlines()
    assert lines[0] == f"{run}: no train.json yet (training, or stopped before its end): 1 epoch(s) in history.csv"
    assert lines[4].split(" | ")[:4] == ["| 1", f"{h['loss']:.4f}", f"{h['lr']:.3g}", f"{h['val_rsum']:.1f}"]


def test_show_of_a_folder_of_runs_lists_them(tiny_synth_run, tmp_path):
    """`xmr show runs/DATASET/` (or `runs/`): one row per run below it, recipes, experiment variants and benchmark
    seeds alike, and a run still training from its history.csv; it used to say "no results files"."""
    import shutil

    summary = json.loads((tiny_synth_run / "train.json").read_text())
    root = tmp_path / "runs" / "synth"
    shutil.copytree(tiny_synth_run, root / "dvse_docs")
    shutil.copytree(tiny_synth_run, root / "exp" / "ablation" / "no_dm")
    (root / "bench" / "b" / "v" / "s0").mkdir(parents=True)
    shutil.copy(tiny_synth_run / "history.csv", root / "bench" / "b" / "v" / "s0" / "history.csv")
    (h,) = summary["history"]
    for folder in (root, tmp_path / "runs"):
        lines = run_xmr("show", folder, check=True).stdout.splitlines()
        assert lines[0] == "| run | method | recipe | epochs | ended by | best val RSUM | best epoch | train s |"
        cells = [ln.strip("| ").split(" | ") for ln in lines[2:]]
        assert [c[0] for c in cells] == [str(root / "bench/b/v/s0"), str(root / "dvse_docs"),
                                         str(root / "exp/ablation/no_dm")]
        done = ["dvse", "dvse_docs", "1", summary["stopped_by"], f"{summary['best_val_rsum']:.1f}", "1",
                f"{summary['train_seconds']:.0f}"]
        assert cells[1][1:] == done and cells[2][1:] == done
        assert cells[0][1:] == ["—", "—", "1", "(no train.json yet)", f"{h['val_rsum']:.1f}", "1", "—"]


def _table(stdout: str) -> list[list[str]]:
    """The cells of each row of a Markdown table (after its header and rule)."""
    return [ln.strip("| ").split(" | ") for ln in stdout.splitlines()[2:]]


def test_show_reads_every_results_file_that_xmr_test_writes(tiny_synth_run, tmp_path):
    """`xmr test --reranks none fr --out F.json` (the benchmark's per-run file) used to be "a run's train.json (no
    retrieval metrics)" to `xmr show`: it is one row per re-ranker, the rows the same run's plain and FR files give;
    the compact --metrics-out files show the same recalls and RSUM."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "S.npy", rng.random((12, 60), dtype=np.float32))  # the tiny test split: 12 images x 5 captions
    common = ["--run", tiny_synth_run, "--sims", tmp_path / "S.npy", "--no-tracking"]
    run_xmr("test", *common, "--reranks", "none", "fr", "--out", tmp_path / "s0.json",
            "--metrics-out", tmp_path / "s0.metrics.json", check=True)
    run_xmr("test", *common, "--out", tmp_path / "dvse_docs.json", check=True)
    run_xmr("test", *common, "--rerank", "fr", "--out", tmp_path / "dvse_docs_fr.json",
            "--metrics-out", tmp_path / "dvse_docs_fr.metrics.json", check=True)

    by_rerank = run_xmr("show", tmp_path / "s0.json", check=True).stdout
    assert by_rerank == run_xmr("show", tmp_path / "dvse_docs.json", tmp_path / "dvse_docs_fr.json",
                                check=True).stdout
    rows = _table(by_rerank)
    assert [r[:3] for r in rows] == [["synth", "dvse_docs", "plain"], ["synth", "dvse_docs_fr", "plain"]]
    doc = json.loads((tmp_path / "s0.json").read_text())["by_rerank"]
    for row, rerank in zip(rows, ("none", "fr")):
        m = doc[rerank]
        assert row[3:10] == [f"{m[d][k]:.1f}" for d in ("i2t", "t2i") for k in ("r1", "r5", "r10")] + \
            [f"{m['rsum']:.1f}"]
        # mAP@R over synth's extended positives (each caption's scene-checked images), then epochs: the run trained one
        assert row[10:13] == [f"{m['extended'][d]['map_at_r']:.1f}" for d in ("i2t", "t2i")] + ["1"]
    # the compact files: named by the file, one row per re-ranker, the recalls and RSUM of the full file's rows
    compact = _table(run_xmr("show", tmp_path / "s0.metrics.json", check=True).stdout)
    assert [r[1] for r in compact] == ["s0", "s0_fr"]
    assert [r[3:10] for r in compact] == [r[3:10] for r in rows]
    (fr,) = _table(run_xmr("show", tmp_path / "dvse_docs_fr.metrics.json", check=True).stdout)
    assert fr[1:10] == ["dvse_docs_fr", "plain", *rows[1][3:10]]
    # a folder: its full results files by name (the --reranks file's two rows), not the compact ones
    listed = _table(run_xmr("show", tmp_path, check=True).stdout)
    assert [r[1] for r in listed] == ["dvse_docs", "dvse_docs_fr", "dvse_docs", "dvse_docs_fr"]
    (tmp_path / "other.json").write_text('{"a": 1}')
    line = _one_line_error(run_xmr("show", tmp_path / "other.json"), "show")
    assert line.startswith(f"xmr show: error: {tmp_path / 'other.json'}: not a results file"), line


def test_show_name_by_file_tells_apart_several_evaluations_of_one_run(tiny_synth_run, tmp_path):
    """DivE Table 5's rows are one run scored with some set elements left out, each evaluated by `xmr test` (the
    run's dataset, so with its extended positives and training columns): by recipe they would all read
    `dvse_docs`; `--name-by file` names them by their files, re-rankers suffixed."""
    rng = np.random.default_rng(1)
    for row in ("all", "image_keep_0"):
        np.save(tmp_path / f"{row}.npy", rng.random((12, 60), dtype=np.float32))
        run_xmr("test", "--run", tiny_synth_run, "--sims", tmp_path / f"{row}.npy", "--no-tracking",
                "--reranks", "none", "fr", "--out", tmp_path / "el" / f"{row}.json", check=True)
    files = [tmp_path / "el" / "all.json", tmp_path / "el" / "image_keep_0.json"]
    assert [r[1] for r in _table(run_xmr("show", *files, check=True).stdout)] == ["dvse_docs", "dvse_docs_fr"] * 2
    rows = _table(run_xmr("show", *files, "--name-by", "file", check=True).stdout)
    assert [r[1] for r in rows] == ["all", "all_fr", "image_keep_0", "image_keep_0_fr"]
    doc = json.loads((tmp_path / "el" / "image_keep_0.json").read_text())["by_rerank"]["none"]
    assert rows[2][10:13] == [f"{doc['extended'][d]['map_at_r']:.1f}" for d in ("i2t", "t2i")] + ["1"]


def test_results_files_round_their_metrics_and_the_table_is_unchanged(tmp_path):
    """A 1,000 x 1,000 matrix (one caption per image) whose ranks are set by hand. Summed in floating point, its
    recalls 1.0 + 5.0 + 10.0 + 0.2 + 2.4 + 4.0 make RSUM 22.599999999999998; the results file says 22.6 (metrics
    to 3 decimals, docs/evaluation.md), and `xmr show` prints what it printed before."""
    n, junk = 1000, list(range(500, 1000))  # pairs 100+ score 0: ties rank their match last (misses); 500+ distract
    sims = np.zeros((n, n), np.float32)
    for i in range(100):
        sims[i, i] = 1.0
        sims[i, junk[:0 if i < 10 else 1 if i < 50 else 5]] = 2.0  # image i: its caption at rank 1, 2 or 6
        sims[junk[:0 if i < 2 else 1 if i < 24 else 5 if i < 40 else 10], i] = 2.0  # caption i: rank 1, 2, 6 or 11
    np.save(tmp_path / "S.npy", sims)
    run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--captions-per-image", "1", "--out", tmp_path / "M.json",
            check=True)
    text = (tmp_path / "M.json").read_text()
    assert '"rsum": 22.6,' in text and "22.59999" not in text
    doc = json.loads(text)
    # ranks: i2t 10 x 1, 40 x 2, 50 x 6, 900 x 1000; t2i 2 x 1, 22 x 2, 16 x 6, 60 x 11, 900 x 1000
    assert doc["i2t"] == {"r1": 1.0, "r5": 5.0, "r10": 10.0, "medr": 1000.0, "meanr": 900.39}
    assert doc["t2i"] == {"r1": 0.2, "r5": 2.4, "r10": 4.0, "medr": 1000.0, "meanr": 900.802}
    assert _table(run_xmr("show", tmp_path / "M.json", check=True).stdout) == [
        ["—", "M", "plain", "1.0", "5.0", "10.0", "0.2", "2.4", "4.0", "22.6", "—", "—", "—", "—", "—", "—"]]


def test_a_binary_file_where_json_is_read_is_one_line(tmp_path):
    """`xmr summarize` given a .npy (a results file expected): one line naming it, no UnicodeDecodeError."""
    np.save(tmp_path / "S.npy", np.ones((2, 2), np.float32))
    line = _one_line_error(run_xmr("summarize", tmp_path / "S.npy", "--out-dir", tmp_path / "out"), "summarize")
    assert line == f"xmr summarize: error: {tmp_path / 'S.npy'}: not a JSON file (not UTF-8 text; a binary file " \
                   "such as a .npy?)"
    assert not (tmp_path / "out").exists()


def test_rerank_param_takes_several_values_after_one_flag(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "S.npy", rng.standard_normal((10, 50)).astype(np.float32))
    # docs/evaluation.md's form: both values after one --rerank-param; the repeated flag gives the same file
    run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--rerank", "fr", "--rerank-param", "gamma1=20", "lambda2=25",
            "--out", tmp_path / "a.json", check=True)
    run_xmr("evaluate", "--sims", tmp_path / "S.npy", "--rerank", "fr", "--rerank-param", "gamma1=20",
            "--rerank-param", "lambda2=25", "--out", tmp_path / "b.json", check=True)
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["rerank_params"]["gamma1"] == 20.0 and a["rerank_params"]["lambda2"] == 25.0
    assert a == b


def test_synth_set_writes_beside_the_workflow_dataset(tmp_path):
    r = run_xmr("synth", "--config-dir", REPO / "config", "--set", "style=v1", "n_train=2", "n_val=1", "n_test=1",
                "image_size=64", cwd=tmp_path, check=True)
    assert not (tmp_path / "data" / "synth").exists()  # the demo's dataset is never the target of a variant
    out = tmp_path / "data" / "synth_style-v1_n_train-2_n_val-1_n_test-1_image_size-64" / "dataset_synth.json"
    assert out.exists(), r.stdout
    assert str(out.relative_to(tmp_path)) in r.stdout


def test_command_line_epochs_win_over_the_stopping_rule_cap(tiny_synth, tmp_path):
    recipe = tiny_synth.recipe("vsepp", name="vsepp_rule", train={
        "epochs": 30, "early_stopping": {"enabled": True, "max_epochs": 4}})
    out = tmp_path / "run"
    r = run_xmr("train", "--config", recipe, "--out-dir", out, "--no-progress", "--set", "train.epochs=1", check=True)
    notes = [ln for ln in r.stdout.splitlines() if "train.early_stopping.max_epochs" in ln]
    assert notes == ["xmr train: --set train.epochs=1: the stopping rule's cap follows it "
                     "(train.early_stopping.max_epochs 4 -> 1; the rule may still stop earlier)"], r.stdout
    assert json.loads((out / "train.json").read_text())["epochs_trained"] == 1
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["train"]["epochs"] == 1 and saved["train"]["early_stopping"]["max_epochs"] == 1


def test_search_rerank_scores_are_the_rerankers_own(tiny_synth_run):
    # one caption query: FR normalises each image's scores over the split's captions with the query among them
    # (as evaluation does), so the scores differ from hit to hit instead of all being 0
    r = run_xmr("search", "--run", tiny_synth_run, "--text", "a red circle", "--k", "3", "--rerank", "fr",
                "--device", "cpu", check=True)
    scores = [float(ln.split()[1]) for ln in r.stdout.splitlines()[1:4]]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 3, r.stdout
    # the same query re-ranked through the API with the split's captions as the population agrees with the CLI
    code = ("import sys, xmr; m = xmr.load(sys.argv[1], device='cpu'); g = m.encode_split();"
            "i, s = m.search(['a red circle'], g['image_emb'], k=3, rerank='fr', reference=g['text_emb']);"
            "print(' '.join(f'{v:.4f}' for v in s[0]))")
    api = subprocess.run([sys.executable, "-c", code, str(tiny_synth_run)], env=xmr_env(), capture_output=True,
                         text=True, check=True).stdout.split()
    assert [float(v) for v in api] == scores


def test_pyproject_licence_is_an_spdx_string_so_install_prints_no_deprecation(tmp_path):
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT"
    r = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                        "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))", str(tmp_path)],
                       cwd=REPO, env=xmr_env(), capture_output=True, text=True, check=True)
    assert "Deprecat" not in r.stdout + r.stderr, r.stdout + r.stderr
    dist = tmp_path / r.stdout.split()[-1]
    assert "License-Expression: MIT" in (dist / "METADATA").read_text()


def test_editable_install_as_make_runs_it_prints_no_setuptools_banner(tmp_path):
    # the Makefile's venv step installs xmr editable under QUIET_EDITABLE; setuptools' build of the editable wheel
    # (what pip runs) prints its "!!" banner without it and nothing with it
    make_var = next(ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("QUIET_EDITABLE :="))
    name, value = make_var.split(":=", 1)[1].strip().split("=", 1)
    build = [sys.executable, "-c", "import sys; from setuptools import build_meta as b; b.build_editable(sys.argv[1])"]
    outs = []
    for extra in ({}, {name: value.strip('"')}):
        r = subprocess.run([*build, str(tmp_path / f"w{len(outs)}")], cwd=REPO, env=xmr_env(**extra),
                           capture_output=True, text=True, check=True)
        outs.append(r.stdout + r.stderr)
    assert "Editable installation" in outs[0] and "!!" in outs[0]
    assert "!!" not in outs[1] and "Warning" not in outs[1], outs[1]


@pytest.mark.parametrize("doc,needle", [("docs/methods/rrf.md", "xmr train --config config/recipes/f30k/rrf.yaml")])
def test_rrf_card_example_names_its_out_dir(doc, needle, tmp_path):
    # the card's line, as printed (one line once the Markdown wrap is joined): on a clone without Flickr30K it
    # gets past the argument checks and stops on the missing dataset, not on "give --out-dir"
    text = " ".join((REPO / doc).read_text().split())
    start = text.index(needle)
    line = text[start:text.index("`", start)].split()
    (tmp_path / "config").symlink_to(REPO / "config")
    r = run_xmr(*line[1:], cwd=tmp_path)
    assert "--out-dir" not in r.stderr, r.stderr


def test_ddp_launch_on_a_missing_dataset_is_xmrs_one_line(tmp_path):
    # docs/pipeline.md's launch by hand, on a clone without COCO: xmr's line, and no launcher is started
    (tmp_path / "config").symlink_to(REPO / "config")
    r = run_xmr("train", "--nproc-per-node", "4", "--config", "config/recipes/coco/dvse.yaml", "--out-dir",
                "runs/coco/dvse", cwd=tmp_path)
    line = _one_line_error(r, "train")
    assert line.startswith("xmr train: error: data/coco/dataset_coco.json: not found; download dataset_coco.json")
    assert "launching:" not in r.stdout and not (tmp_path / "runs").exists()


NOT_A_RUN = ("not found; nowhere is not a run directory (train it with `xmr train`, or import one with "
             "`xmr import-checkpoint`)")


@pytest.mark.parametrize("args,says", [
    (["train", "--run", "runs/synth/dvse", "--out-dir", "elsewhere"],
     "--run RUN_DIR names both the config and the run directory: drop --config/--experiment/--out-dir"),
    (["train", "--config", "config/recipes/synth/dvse.yaml"],
     "give --run RUN_DIR, or --out-dir DIR with --config FILE (or --experiment/--variant)"),
    (["train", "--experiment", "dvse_k_sweep", "--out-dir", "elsewhere"],
     "give either --run RUN_DIR, --config FILE or --experiment FILE --variant NAME"),
    (["evaluate", "--images", "I.npy", "--out", "elsewhere/M.json"],
     "--images given alone: give both --images and --captions"),
    (["extract", "--dataset", "synth", "--backbone", "efficientnet_lite0_128", "--split", "val", "--out",
      "elsewhere/val.h5", "--threads", "0"], "--threads 0: give a positive number of CPU threads"),
    (["score", "--run", "nowhere", "--out", "elsewhere/S.npy"], f"nowhere/config.yaml: {NOT_A_RUN}"),
    (["test", "--run", "nowhere", "--sims", "S.npy", "--out", "elsewhere/r.json"], f"nowhere/config.yaml: {NOT_A_RUN}"),
])
def test_option_mistakes_fail_before_torch_is_imported(args, says):
    # each a one-line error naming what to drop or add, and at once: the options are checked before torch loads
    # (2-3 s on the 2-core development VM), and nothing is written
    env = {**xmr_env(), "PYTHONPROFILEIMPORTTIME": "1"}
    r = run_xmr(*args, cwd=REPO, env=env)
    imported = [ln.rsplit("|", 1)[-1].strip() for ln in r.stderr.splitlines() if ln.startswith("import time:")]
    r.stderr = "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("import time:"))
    assert _one_line_error(r, args[0]) == f"xmr {args[0]}: error: {says}"
    assert "xmr.cli" in imported and "torch" not in imported
    assert not (REPO / "elsewhere").exists()


def test_ranks_out_writes_the_per_query_ranks_behind_the_recalls(tiny_synth_run, tmp_path):
    """`xmr test --reranks none fr --ranks-out R.npz` (what the evaluate rule runs): each query's rank of its first
    positive under each re-ranker; the recalls computed from them are the results file's, and the ranks of the plain
    matrix are the ones counted by hand from it (5 captions per image, caption j belongs to image j // 5)."""
    rng = np.random.default_rng(1)
    sims = rng.random((12, 60), dtype=np.float32)
    np.save(tmp_path / "S.npy", sims)
    run_xmr("test", "--run", tiny_synth_run, "--sims", tmp_path / "S.npy", "--no-tracking", "--reranks", "none", "fr",
            "--out", tmp_path / "s0.json", "--ranks-out", tmp_path / "s0.ranks.npz", check=True)
    doc = json.loads((tmp_path / "s0.json").read_text())["by_rerank"]
    with np.load(tmp_path / "s0.ranks.npz") as z:
        ranks = {k: z[k] for k in z.files}
    assert int(ranks["captions_per_image"]) == 5
    owner = np.arange(60) // 5
    # i2t: how many captions of other images score above the image's best own caption
    best = np.array([sims[i, owner == i].max() for i in range(12)])
    by_hand_i2t = np.array([(sims[i, owner != i] > best[i]).sum() for i in range(12)])
    by_hand_t2i = np.array([(sims[:, j] > sims[owner[j], j]).sum() for j in range(60)])
    assert (ranks["none/i2t"] == by_hand_i2t).all() and (ranks["none/t2i"] == by_hand_t2i).all()
    for rerank in ("none", "fr"):
        for d in ("i2t", "t2i"):
            for k in (1, 5, 10):
                assert 100 * np.mean(ranks[f"{rerank}/{d}"] < k) == pytest.approx(doc[rerank][d][f"r{k}"], abs=1e-3)
    assert not any(k.startswith("query_ranks") for k in doc["none"])  # the arrays are not in the JSON


def test_show_expect_checks_each_rsum_against_a_readme_section(tiny_synth_run, tmp_path):
    """`xmr show R.json --expect README.md#demo-synth` (what `make demo` runs): within --rsum-tolerance of the
    section's row of the same dataset and target it says by how much; further, one line naming the target and both
    values, exit 2; a README without the section is named."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "S.npy", rng.random((12, 60), dtype=np.float32))
    run_xmr("test", "--run", tiny_synth_run, "--sims", tmp_path / "S.npy", "--no-tracking",
            "--out", tmp_path / "dvse_docs.json", check=True)
    rsum = json.loads((tmp_path / "dvse_docs.json").read_text())["rsum"]
    readme = tmp_path / "README.md"

    def write(value: float) -> None:
        readme.write_text("intro\n<!-- xmr:demo-synth -->\n| dataset | target | RSUM |\n|---|---|---|\n"
                          f"| synth | dvse_docs | {value:.1f} |\n<!-- /xmr:demo-synth -->\n")

    write(rsum + 5.0)
    r = run_xmr("show", tmp_path / "dvse_docs.json", "--expect", f"{readme}#demo-synth", check=True)
    assert r.stdout.splitlines()[-1] == f"RSUM within ±8 of {readme}#demo-synth: dvse_docs {rsum:.1f} (-5.0)"
    r = run_xmr("show", tmp_path / "dvse_docs.json", "--expect", f"{readme}#demo-synth", "--rsum-tolerance", "4")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"xmr show: error: dvse_docs: RSUM {rsum:.1f} is -5.0 from {readme}#demo-synth's {rsum + 5:.1f}, beyond the "
        f"±4 that CPUs differ by; the table is stale or this run went wrong")
    r = run_xmr("show", tmp_path / "dvse_docs.json", "--expect", f"{readme}#demo-other")
    assert r.returncode == 2 and "expected one section 'demo-other'" in r.stderr
