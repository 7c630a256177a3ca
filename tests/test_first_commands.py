"""The first commands a newcomer types, and the mistakes they make there, as the user types them (``run_xmr``):
each mistake is one line naming what the user gave (``--set``, the choice, the file whose ``name:`` is wrong), in
one path style, and an output folder that did not exist is said to have been made."""

from __future__ import annotations

import json
import math
import re
import subprocess
import time

import numpy as np
import pytest
import yaml

from conftest import REPO, run_xmr, run_xmr_process


def _one_line_error(r: subprocess.CompletedProcess, command: str) -> str:
    """The command failed with exactly one line on stderr, naming itself, and no traceback or usage text."""
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr and "usage:" not in r.stderr, r.stderr
    assert lines[0].startswith(f"xmr {command}: error: "), lines[0]
    return lines[0].removeprefix(f"xmr {command}: error: ")


# -- --set, choices, --out ----------------------------------------------------------------------------------------

def test_a_misspelt_set_key_is_blamed_on_set_not_on_the_recipe(tmp_path):
    r = run_xmr("train", "--run", "runs/synth/vsepp", "--set", "train.epochs=2", "optim.lrr=1e-4", cwd=REPO)
    assert _one_line_error(r, "train") == "--set optim.lrr=1e-4: unknown key 'optim.lrr'; did you mean: lr?"
    r = run_xmr("train", "--run", "runs/synth/vsepp", "--set", "train.epochs=two", cwd=REPO)
    assert _one_line_error(r, "train") == "--set train.epochs=two: train.epochs: 'two' is not of type 'integer'"
    # the recipe's own mistake is still the recipe's, --set or not
    recipe = tmp_path / "config" / "recipes" / "synth" / "typo.yaml"
    recipe.parent.mkdir(parents=True)
    recipe.write_text(f"extends: {REPO / 'config/recipes/synth/vsepp.yaml'}\nmodel: {{embed_dimm: 8}}\n")
    r = run_xmr("train", "--config", "config/recipes/synth/typo.yaml", "--out-dir", "o", "--set", "train.epochs=1",
                cwd=tmp_path)
    assert _one_line_error(r, "train") == ("config/recipes/synth/typo.yaml: unknown key 'model.embed_dimm'; "
                                           "did you mean: embed_dim?")
    assert not (tmp_path / "o").exists()


def test_a_misspelt_choice_or_option_is_one_line_pointing_to_help(tmp_path):
    r = run_xmr("evaluate", "--sims", "S.npy", "--protocol", "coco6k", "--out", "M.json", cwd=tmp_path)
    assert _one_line_error(r, "evaluate") == (
        "argument --protocol: invalid choice: 'coco6k' (choose from 'coco1k', 'coco5k', 'f30k', 'plain', 'cub', "
        "'eccv', 'cxc'); "
        "see xmr evaluate --help")
    r = run_xmr("show", "--bogus", "x.json", cwd=tmp_path)  # named by the command it was given to
    assert _one_line_error(r, "show") == "unrecognized arguments: --bogus; see xmr show --help"
    assert run_xmr("--help").returncode == 0


def test_an_output_folder_that_did_not_exist_is_made_and_said(tmp_path):
    # image 0's captions are 0-4, image 1's 5-9; each image ranks its own first caption first (i2t R@1 100)
    sims = np.zeros((2, 10), np.float32)
    sims[0, 0] = sims[1, 5] = 1
    np.save(tmp_path / "S.npy", sims)
    out = tmp_path / "new" / "sub" / "M.json"  # given absolute, shown relative to the working folder
    r = run_xmr("evaluate", "--sims", "S.npy", "--out", out, cwd=tmp_path, check=True)
    assert r.stderr.splitlines() == ["xmr evaluate: made the folder new/sub/ for --out (it did not exist)"]
    assert json.loads(out.read_text())["i2t"]["r1"] == 100.0
    r = run_xmr("evaluate", "--sims", "S.npy", "--out", out, cwd=tmp_path, check=True)  # there now: nothing said
    assert "made the folder" not in r.stderr


# -- datasets: name and path style -----------------------------------------------------------------------------------

def test_a_dataset_file_whose_name_differs_from_its_file_name_is_refused(tmp_path):
    (tmp_path / "config" / "datasets").mkdir(parents=True)
    ds = yaml.safe_load((REPO / "config" / "datasets" / "synth.yaml").read_text())
    (tmp_path / "config" / "datasets" / "mine.yaml").write_text(yaml.safe_dump(ds))  # a copy of synth's: name synth
    r = run_xmr("doctor", "mine", cwd=tmp_path)
    assert _one_line_error(r, "doctor") == ("config/datasets/mine.yaml: name: synth differs from the file's name; "
                                            "set name: mine (or rename the file to synth.yaml, and the recipes' "
                                            "dataset: to synth)")


def test_paths_in_errors_are_relative_to_the_working_folder(tmp_path):
    # the recipe's config folder is found from the recipe's resolved path; the error names it as the user would
    recipe = tmp_path / "config" / "recipes" / "synth" / "elsewhere.yaml"
    recipe.parent.mkdir(parents=True)
    (tmp_path / "config" / "datasets").mkdir()
    (tmp_path / "config" / "datasets" / "synth.yaml").write_text((REPO / "config/datasets/synth.yaml").read_text())
    recipe.write_text(f"extends: {REPO / 'config/recipes/synth/vsepp.yaml'}\ndataset: nosuch\n")
    r = run_xmr("train", "--config", recipe, "--out-dir", tmp_path / "o", cwd=tmp_path)
    assert _one_line_error(r, "train") == ("dataset 'nosuch': no config/datasets/nosuch.yaml; known datasets: "
                                           "synth")


# -- doctor ----------------------------------------------------------------------------------------------------------

def test_doctor_refuses_an_unknown_synth_target_as_for_any_dataset():
    line = _one_line_error(run_xmr("doctor", "synth", "results/synth/nonsense.json", cwd=REPO), "doctor")
    assert line.startswith("no recipe for results/synth/nonsense.json: expected config/recipes/synth/nonsense.yaml"
                           " (recipes for synth: clip_tiny, coder, dive, dvse, dvse_demo,"), line
    coco = _one_line_error(run_xmr("doctor", "coco", "results/coco/nonsense.json", cwd=REPO), "doctor")
    assert re.sub(r"\(recipes for coco: .*", "", coco) == "no recipe for results/coco/nonsense.json: expected " \
                                                          "config/recipes/coco/nonsense.yaml "
    r = run_xmr("doctor", "synth", "results/synth/dvse_fr.json", cwd=REPO, check=True)  # a real one: nothing missing
    assert r.stdout.splitlines()[0] == "xmr doctor synth results/synth/dvse_fr.json  (recipe dvse, re-ranker fr)"


# -- recalls that cannot miss ----------------------------------------------------------------------------------------

def test_recalls_whose_k_reaches_the_gallery_are_said_to_be_100_by_construction(tmp_path):
    # 5 test images x 25 captions, every caption ranking a wrong image first: t2i R@1 = 0, yet R@5 and R@10 are 100
    # because 5 images is the whole gallery; i2t R@10 can still miss (20 other captions)
    sims = np.zeros((5, 25), np.float32)
    for c in range(25):
        sims[(c // 5 + 1) % 5, c] = 1.0
    np.save(tmp_path / "S5.npy", sims)
    r = run_xmr("evaluate", "--sims", "S5.npy", "--out", "M5.json", cwd=tmp_path, check=True)
    first, note = r.stdout.splitlines()
    assert "t2i R@1/5/10 0.0/100.0/100.0" in first, first
    assert note == "note: R@K with K >= the gallery's size is 100 by construction: t2i R@5, R@10 (5 images)"
    shown = run_xmr("show", "M5.json", cwd=tmp_path, check=True).stdout.splitlines()
    assert shown[3:] == [f"{note} (in M5)"]  # once, under the table
    # 11 images, 55 captions: nothing reaches the gallery, nothing said
    np.save(tmp_path / "S11.npy", np.eye(11, 55, dtype=np.float32))
    r = run_xmr("evaluate", "--sims", "S11.npy", "--out", "M11.json", cwd=tmp_path, check=True)
    assert len(r.stdout.splitlines()) == 1 and "note" not in run_xmr("show", "M11.json", cwd=tmp_path).stdout


# -- xmr search ------------------------------------------------------------------------------------------------------

def test_search_refuses_an_empty_query_and_warns_on_one_with_no_known_word(tiny_synth_run):
    r = run_xmr("search", "--run", tiny_synth_run, "--text", "  ", "--device", "cpu")
    assert _one_line_error(r, "search") == "--text '  ': an empty query; give the words to search for"
    r = run_xmr("search", "--run", tiny_synth_run, "--text", "qwzx blorf", "--k", "2", "--device", "cpu", check=True)
    assert r.stderr.splitlines() == [
        "xmr search: warning: --text 'qwzx blorf': no word of it is in the model's vocabulary (the words of its "
        "training captions); each reads as <unk>, so its hits say nothing about the query"]
    assert len(r.stdout.splitlines()) == 3  # the hits are still printed
    r = run_xmr("search", "--run", tiny_synth_run, "--text", "qwzx circle", "--k", "2", "--device", "cpu", check=True)
    assert "warning" not in r.stderr  # one known word is a query


def test_an_image_querys_own_captions_are_marked_among_its_hits(tiny_synth_run):
    from xmr.data import load_split
    from xmr.run.config import load_saved_config

    test = load_split(load_saved_config(tiny_synth_run)["dataset_cfg"], "test")
    query = 3
    own = {c for c, i in zip(test.captions, test.caption_image) if i == query}
    r = run_xmr("search", "--run", tiny_synth_run, "--image", test.image_paths[query], "--k", len(test.captions),
                "--device", "cpu", check=True)
    hits = r.stdout.splitlines()[1:]
    assert len(hits) == len(test.captions) == 60
    marked = [h for h in hits if h.endswith("  [a caption of the query image]")]
    assert len(marked) == len(own) == 5
    assert {h.removesuffix("  [a caption of the query image]").split(": ", 1)[1] for h in marked} == own


# -- xmr show, from a run's first step -------------------------------------------------------------------------------

def test_show_says_where_a_run_is_from_its_first_step(tiny_synth, tmp_path):
    """`xmr show RUN_DIR` during the first epoch (no history.csv, no train.json yet): the run's method, recipe and
    dataset from its config.yaml, and where it is from its progress.json; it used to say "no results files"."""
    from conftest import start_xmr_forked

    out = tmp_path / "run"
    recipe = tiny_synth.recipe("vsepp", name="vsepp_first_step", train={"epochs": 3})
    proc = start_xmr_forked("train", "--config", recipe, "--out-dir", out, "--no-progress")
    deadline = time.time() + 300
    while not (out / "progress.json").exists():  # written before the first step
        assert proc.poll() is None and time.time() < deadline, proc.wait(0).stderr
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert not (out / "train.json").exists()
    progress = json.loads((out / "progress.json").read_text())
    steps = math.ceil(48 * 5 / 16)  # tiny_synth: 48 training images x 5 captions, batches of 16
    assert (progress["epoch"], progress["max_epochs"], progress["steps_per_epoch"]) == (1, 3, steps)
    r = run_xmr("show", out, check=True)
    first = r.stdout.splitlines()[0]
    loss = "" if progress["loss_so_far"] is None else f", loss so far {progress['loss_so_far']:.4f}"
    history = out / "history.csv"  # none until the first epoch ends (kept here as the kill may come after it)
    epochs = len(history.read_text().splitlines()) - 1 if history.exists() else 0
    assert re.fullmatch(
        re.escape(f"{out}: vsepp (recipe vsepp_first_step) on synth; no train.json yet (training, or stopped before "
                  f"its end): {epochs} epoch(s) in history.csv; at epoch 1 of 3, step {progress['step']} of "
                  f"{steps}{loss} (") + r"\d+ s ago\)", first), first
    listed = run_xmr("show", tmp_path, check=True).stdout.splitlines()  # the folder of runs lists it too
    assert listed[2].startswith(f"| {out} | vsepp | vsepp_first_step | "), listed


def test_a_finished_runs_progress_record_holds_its_last_epochs_mean_loss(tiny_synth_run):
    progress = json.loads((tiny_synth_run / "progress.json").read_text())
    (epoch,) = json.loads((tiny_synth_run / "train.json").read_text())["history"]
    assert progress["step"] == progress["steps_per_epoch"] and progress["epoch"] == progress["max_epochs"] == 1
    assert progress["loss_so_far"] == pytest.approx(epoch["loss"], rel=1e-12)


# -- training threads ------------------------------------------------------------------------------------------------

def test_train_threads_are_the_cores_given_never_more_than_the_cpus_there_are(tiny_synth, tmp_path):
    """`xmr train --threads N` (the workflow passes the cores Snakemake gives the job): torch's threads, capped at
    the CPUs this process may run on (more would oversubscribe them); train.json says how many it used."""
    import os

    line = _one_line_error(run_xmr("train", "--config", "c.yaml", "--out-dir", tmp_path / "o", "--threads", "0"),
                           "train")
    assert line == "--threads 0: give a positive number of CPU threads"
    recipe = tiny_synth.recipe("vsepp", name="vsepp_threads")
    run_xmr("train", "--config", recipe, "--out-dir", tmp_path / "run", "--threads", "64", "--no-progress",
            check=True)
    assert json.loads((tmp_path / "run" / "train.json").read_text())["cpu_threads"] == len(os.sched_getaffinity(0))
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["train"]["threads"] == 64  # as asked


def test_threads_sleep_while_they_wait_only_where_other_programs_hold_the_cores():
    """2 threads on 2 CPUs: free (0.1 busy), they may spin; with 1.6 held by others, only 0.4 is free for 2
    threads, so they wait asleep. One thread on 2 CPUs with one held: one free CPU, it may spin."""
    from xmr.core.cpus import wait_policy_for

    assert wait_policy_for(2, 0.1, 2) is None
    assert wait_policy_for(2, 1.6, 2) == "PASSIVE"
    assert wait_policy_for(None, 1.6, 2) == "PASSIVE"  # no --threads: one per CPU
    assert wait_policy_for(1, 1.0, 2) is None
    assert wait_policy_for(2, None, 2) is None  # nothing measured: OpenMP's default


def test_a_training_started_beside_busy_programs_waits_asleep(tiny_synth, tmp_path):
    """`xmr train` in a fresh process, on a machine busy loops hold as it starts: its OpenMP threads sleep while they
    wait (train.json records the policy it ran under). The loops stop after 3 s, well after the command has looked
    (before it loads torch), so that they do not slow the rest of the suite."""
    import os
    import sys
    import threading

    recipe = tiny_synth.recipe("vsepp", name="vsepp_busy")
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    stop = threading.Timer(3.0, lambda: [p.kill() for p in loops])
    stop.start()
    try:
        run_xmr_process("train", "--config", recipe, "--out-dir", tmp_path / "run", "--threads", "2", "--no-progress",
                        check=True)
    finally:
        stop.cancel()
        for p in loops:
            p.kill()
    assert json.loads((tmp_path / "run" / "train.json").read_text())["omp_wait_policy"] == "PASSIVE"
