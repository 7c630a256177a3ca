"""The results report (xmr/report): paper numbers, FR grid, tables, figures and the HTML/Markdown report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from xmr.core.errors import XmrError
from xmr.settings.run_settings import run_settings


# -- paper_results.yaml ------------------------------------------------------------------------------------------------

def test_paper_results_entries_name_their_source():
    from xmr.report.paper import load_paper_results

    doc = load_paper_results()
    assert len(doc["entries"]) >= 60
    for e in doc["entries"]:
        assert re.search(r"Table A?[0-9IVX]+", e["source"]), e  # the paper table the numbers come from (A1: supplement)
        assert e["rerank"] in ("none", "fr", "rr", "mr") and e["role"] in ("proposed", "baseline")
        recalls = e["i2t"] + e["t2i"]
        if e["rsum"] is not None and None not in recalls:
            # transcription check: the printed RSUM is the sum of the six printed recalls (papers round to 0.1)
            assert abs(sum(recalls) - e["rsum"]) <= 0.35, e
    keys = [(e["dataset"], e["recipe"], e["protocol"], e["rerank"]) for e in doc["entries"]]
    assert len(keys) == len(set(keys)), "two entries for the same setting"
    for name, exp in doc["experiments"].items():
        assert exp["source"] and exp["rsum"], name


def test_paper_entry_matches_the_same_setting():
    from xmr.report.paper import match_entry, paper_entries, paper_row

    entries = paper_entries("f30k")
    e = match_entry(entries, "f30k", "dvse", "f30k", "fr")
    assert e["rsum"] == 524.5 and e["i2t"] == [85.6, 96.2, 98.0]  # DVSE Table II, BUTD + Bi-GRU + FR
    assert paper_row(e)["t2i R@10"] == 92.7
    assert match_entry(entries, "f30k", "dvse", "f30k", "csls") is None


def test_paper_results_file_errors_name_the_entry(tmp_path):
    from xmr.report.paper import load_paper_results

    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"entries": [{"method": "dvse", "recipe": "dvse", "dataset": "f30k",
                                              "protocol": "f30k", "rerank": "none", "setting": "x", "role": "proposed",
                                              "i2t": [1, 2, 3], "t2i": [1, 2, 3], "rsum": 12}]}))
    with pytest.raises(XmrError, match=r"entries\[0\]: missing required key 'source'"):
        load_paper_results(p)


# -- tables ------------------------------------------------------------------------------------------------------------

def test_summary_table_has_method_and_train_time(tmp_path):
    from xmr.report.tables import result_rows, write_summary

    res, runs = tmp_path / "results", tmp_path / "runs"
    metrics = {"i2t": {"r1": 10.0, "r5": 20.0, "r10": 30.0}, "t2i": {"r1": 1.0, "r5": 2.0, "r10": 3.0}, "rsum": 66.0}
    (res / "synth").mkdir(parents=True)
    (res / "synth" / "m.json").write_text(json.dumps({**metrics, "protocol": "plain", "dataset": "synth",
                                                      "recipe": "m", "method": "vsepp", "rerank": "none"}))
    (runs / "synth" / "m").mkdir(parents=True)
    (runs / "synth" / "m" / "train.json").write_text(json.dumps({"train_seconds": 150.0}))
    write_summary([res / "synth" / "m.json"], tmp_path / "out", runs_root=runs)
    md = (tmp_path / "out" / "summary.md").read_text().splitlines()
    assert md[0] == ("| target | method | protocol | i2t R@1 | i2t R@5 | i2t R@10 | t2i R@1 | t2i R@5 | t2i R@10 | "
                     "RSUM | train (min) |")
    assert md[2] == "| m | vsepp | plain | 10.0 | 20.0 | 30.0 | 1.0 | 2.0 | 3.0 | 66.0 | 2.5 |"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == {"m": {"protocol": "plain", "i2t_R1": 10.0, "i2t_R5": 20.0, "i2t_R10": 30.0, "t2i_R1": 1.0,
                             "t2i_R5": 2.0, "t2i_R10": 3.0, "RSUM": 66.0}}
    # a class-level (CUB) result has no rsum: the table sums the six recalls, and shows R-Precision
    cub = {"i2t": {"r_precision": 25.0, "r1": 40.0, "r5": 60.0, "r10": 70.0},
           "t2i": {"r_precision": 20.0, "r1": 30.0, "r5": 50.0, "r10": 60.0}}
    (res / "synth" / "c.json").write_text(json.dumps({**cub, "protocol": "cub", "dataset": "synth", "recipe": "c",
                                                      "method": "dvse", "rerank": "fr"}))
    row = result_rows([res / "synth" / "c.json"], runs)[0]
    assert row["RSUM"] == 310.0 and row["i2t R-P"] == 25.0 and row["target"] == "c_fr" and row["train (min)"] is None


def test_show_table_says_how_training_ended_the_spread_and_the_set_correlation(tmp_path):
    from xmr.report.tables import markdown_table, result_rows

    metrics = {"i2t": {"r1": 10.0, "r5": 20.0, "r10": 30.0}, "t2i": {"r1": 1.0, "r5": 2.0, "r10": 3.0}, "rsum": 66.0}
    path = tmp_path / "d.json"
    path.write_text(json.dumps({**metrics, "protocol": "plain", "dataset": "synth", "recipe": "dvse", "rerank": "none",
                                "epochs_trained": 5, "stopped_by": "cap",
                                "similarity_spread": {"std": 0.10142, "margin": 0.01}}))
    md = markdown_table(result_rows([path], tmp_path / "runs")).splitlines()
    assert md[0].endswith("| RSUM | i2t mAP@R (ext.) | t2i mAP@R (ext.) | epochs | ended by | test sim. std | set corr. |")
    assert md[2] == "| synth | dvse | plain | 10.0 | 20.0 | 30.0 | 1.0 | 2.0 | 3.0 | 66.0 | — | — | 5 | cap | 0.1014 | — |"
    # a set method's results: the mean off-diagonal cosine of its sub-embeddings (set_statistics.correlation)
    # and its mAP@R over extended positives (synth's scene-checked ones)
    doc = json.loads(path.read_text()) | {"set_statistics": {"k": 6, "correlation": 0.99412}, "extended": {
        "positives": "synth_scenes", "i2t": {"map_at_r": 12.34, "r_precision": 20.0, "r1": 30.0},
        "t2i": {"map_at_r": 5.66, "r_precision": 6.0, "r1": 7.0}}}
    path.write_text(json.dumps(doc))
    md = markdown_table(result_rows([path], tmp_path / "runs")).splitlines()
    assert md[2] == ("| synth | dvse | plain | 10.0 | 20.0 | 30.0 | 1.0 | 2.0 | 3.0 | 66.0 | 12.3 | 5.7 | 5 | cap | 0.1014 "
                     "| 0.994 |")


# -- FR grid -----------------------------------------------------------------------------------------------------------

SIMS = np.array([  # 6 images x 12 captions (2 per image), values chosen so FR's scales change the rankings
    [0.67, 0.50, 0.09, 0.65, 0.46, 0.99, 0.85, 0.84, 0.05, 0.56, 0.61, 0.05],
    [0.48, 0.33, 0.52, 1.10, 0.42, 0.10, 0.37, 0.91, 0.39, 0.19, 0.07, 0.51],
    [0.67, 0.41, 0.85, 0.52, 1.10, 0.87, 0.59, 0.41, 0.11, 0.70, 0.86, 0.73],
    [0.42, 0.09, 0.19, 0.55, 0.66, 0.03, 1.24, 1.01, 0.72, 0.99, 0.62, 0.49],
    [0.22, 0.69, 0.70, 0.95, 0.93, 0.49, 0.85, 0.96, 0.72, 0.91, 0.59, 0.48],
    [0.47, 0.22, 0.19, 0.31, 0.59, 0.66, 0.82, 0.29, 0.52, 0.45, 0.47, 1.28],
], dtype=np.float32)


def naive_fr_rsum(a: np.ndarray, g1: float, g2: float, l1: float, l2: float, c: int = 2) -> float:
    """RSUM after FR, written out directly from DVSE Eqs. 14-15 with plain numpy (no xmr code)."""
    def lse(x, axis):
        m = x.max(axis=axis, keepdims=True)
        return m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))

    i2t = g2 * a - lse(g1 * a, 0)  # normalise over images (columns)
    t2i = l2 * a - lse(l1 * a, 1)  # normalise over captions (rows)
    n, m = a.shape
    total = 0.0
    for k in (1, 5, 10):
        hits = 0
        for i in range(n):  # rank of the best ground-truth caption, ties pessimistic
            best = max(i2t[i, j] for j in range(i * c, (i + 1) * c))
            hits += int(sum(i2t[i] >= best) - 1 < k)  # includes the caption itself
        total += 100.0 * hits / n
        hits = 0
        for j in range(m):
            hits += int(sum(t2i[:, j] >= t2i[j // c, j]) - 1 < k)
        total += 100.0 * hits / m
    return total


def test_fr_grid_matches_direct_evaluations():
    from xmr.evaluation import evaluate_sims
    from xmr.report.fr_grid import fr_grid

    gammas, lambdas = [1.0, 10.0], [2.0, 5.0, 20.0]  # scores stay > 1e-4 apart: no float32 near-ties
    grid = fr_grid(SIMS, gammas, lambdas, "plain", 2)
    assert np.array(grid["rsum"]).shape == (2, 3)
    for a, g in enumerate(gammas):
        for b, lam in enumerate(lambdas):
            direct = evaluate_sims(SIMS, "plain", 2, rerank="fr",
                                   rerank_params={"gamma1": g, "gamma2": g, "lambda1": lam, "lambda2": lam})
            assert grid["rsum"][a][b] == pytest.approx(direct["rsum"])
            assert grid["rsum"][a][b] == pytest.approx(naive_fr_rsum(SIMS, g, g, lam, lam))
    # untied cells: image->text over (γ1, γ2), text->image over (λ1, λ2)
    direct = evaluate_sims(SIMS, "plain", 2, rerank="fr",
                           rerank_params={"gamma1": 10.0, "gamma2": 1.0, "lambda1": 2.0, "lambda2": 20.0})
    assert grid["i2t"]["r1"][1][0] == pytest.approx(direct["i2t"]["r1"])
    assert grid["i2t"]["sum"][1][0] == pytest.approx(sum(direct["i2t"][f"r{k}"] for k in (1, 5, 10)))
    assert grid["t2i"]["sum"][0][2] == pytest.approx(sum(direct["t2i"][f"r{k}"] for k in (1, 5, 10)))
    assert grid["plain"]["rsum"] == pytest.approx(evaluate_sims(SIMS, "plain", 2)["rsum"])
    # the grid is informative: the scales change RSUM
    assert len({round(v, 6) for row in grid["rsum"] for v in row}) >= 3
    best = grid["best"]["tied"]
    assert best["rsum"] == max(max(r) for r in grid["rsum"])
    with pytest.raises(XmrError, match="gammas values must be > 0"):
        fr_grid(SIMS, [0.0], [1.0], "plain", 2)


# -- the report on a tiny trained run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_project(tiny_synth, module_tmp):
    """runs/ and results/ of a tiny vsepp and a tiny dvse (1 epoch each) on the tiny_synth fixture."""
    from xmr.run.config import load_run_config
    from xmr.core.io import atomic_path, write_json
    from xmr.run.results import evaluate_run
    from xmr.train.trainer import train
    from xmr.inference.model import score_split

    root = module_tmp("report_project")
    runs, results = root / "runs", root / "results"
    recipes = {"vsepp": tiny_synth.recipe("vsepp", "rep_vsepp"),
               "dvse": tiny_synth.recipe("dvse", "rep_dvse", model={"num_embeds": 2, "attention_hidden": 16})}
    for name, recipe in recipes.items():
        run = runs / "synth" / f"rep_{name}"
        train(load_run_config(recipe), run, progress=False)
        sims, _ = score_split(run, progress=False)
        with atomic_path(run / "test_sims.npy", ".npy") as tmp:
            with open(tmp, "wb") as f:
                np.save(f, sims)
        write_json(results / "synth" / f"rep_{name}.json", evaluate_run(run, run / "test_sims.npy", track=False))
    run = runs / "synth" / "rep_vsepp"
    write_json(results / "synth" / "rep_vsepp_fr.json", evaluate_run(run, run / "test_sims.npy", "fr", track=False))
    (tiny_synth.config_dir / "report.yaml").write_text(yaml.safe_dump({
        "default": {"methods": ["rep_vsepp", "rep_dvse", "rep_pcme"], "rerank": ["none", "fr"], "experiments": [],
                    "fr_grid": {"recipes": ["rep_vsepp", "rep_dvse"], "split": "test", "gammas": [5, 25],
                                "lambdas": [5, 20]},
                    "examples": {"recipe": None, "queries": 1, "top_k": 3, "seed": 0},
                    "subembeddings": {"recipes": ["rep_dvse"], "images": 1, "seed": 0},
                    "readme": [], "results_page": {"path": "docs/results_{dataset}.md", "parts": []},
                    "doc_sections": {}, "curves": True, "mlflow": False}}))
    return {"root": root, "runs": runs, "results": results, "config": tiny_synth.config_dir}


def test_fr_grid_cli_on_a_trained_run(tiny_project):
    from xmr.cli import main

    run = tiny_project["runs"] / "synth" / "rep_vsepp"
    out = tiny_project["results"] / "synth" / "fr_grid" / "rep_vsepp" / "test"
    assert main(["fr-grid", "--run", str(run), "--sims", str(run / "test_sims.npy"), "--gammas", "5", "25",
                 "--lambdas", "5", "20", "--out-dir", str(out)]) == 0
    grid = json.loads((out / "fr_grid.json").read_text())
    assert grid["protocol"] == "plain" and grid["configured"]["gamma1"] == 25.0  # synth uses the f30k FR row
    lines = (out / "fr_grid.csv").read_text().strip().splitlines()
    assert len(lines) == 1 + 4 + 4 + 4  # header, 2x2 gamma grid, 2x2 lambda grid, 2x2 tied grid
    assert (out / "fr_grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_renders_html_and_markdown(tiny_project, tmp_path):
    from xmr.report.build import write_report

    # the FR grid of rep_vsepp comes from the CLI test when it ran first; make sure it exists either way
    grid_dir = tiny_project["results"] / "synth" / "fr_grid" / "rep_vsepp" / "test"
    if not (grid_dir / "fr_grid.json").exists():
        from xmr.report.fr_grid import run_fr_grid

        run = tiny_project["runs"] / "synth" / "rep_vsepp"
        run_fr_grid(run, run / "test_sims.npy", [5, 25], [5, 20], grid_dir)
    out = write_report(["synth"], tmp_path / "rep", tiny_project["config"], tiny_project["results"],
                       tiny_project["runs"], track=False)
    page = Path(out["html"]).read_text()
    md = Path(out["md"]).read_text()
    plain = json.loads((tiny_project["results"] / "synth" / "rep_vsepp.json").read_text())
    fr = json.loads((tiny_project["results"] / "synth" / "rep_vsepp_fr.json").read_text())
    # the results table: one row per results file, numbers from the files
    assert "<table>" in page
    row = next(line for line in md.splitlines() if line.startswith("| vsepp | rep_vsepp | plain |"))
    assert f"| {plain['i2t']['r1']:.1f} | {plain['i2t']['r5']:.1f} |" in row
    assert f"{plain['rsum']:.1f}" in row
    assert any(line.startswith("| vsepp | rep_vsepp | fr |") and f"{fr['rsum']:.1f}" in line
               for line in md.splitlines())
    # figures are embedded (self-contained page) and linked from the Markdown
    imgs = re.findall(r"<img [^>]*src='([^']*)'", page)
    assert len(imgs) >= 6 and all(src.startswith("data:image/png;base64,") for src in imgs)
    assert "http" not in "".join(re.findall(r"src='([^']*)'", page))
    for name in ("synth_training_curves.png", "synth_examples_t2i.png", "synth_examples_i2t.png",
                 "synth_fr_grid_rep_vsepp_test.png", "synth_attention_rep_dvse.png",
                 "synth_correlation_rep_dvse_embeddings.png"):
        assert f"]({name})" in md and (tmp_path / "rep" / name).exists()
    # missing pieces are notes, not errors
    assert "Not trained/evaluated yet on synth: rep_pcme" in md
    assert any(line.startswith("> Note: Not evaluated yet") and "rep_dvse_fr.json" in line and "rep_vsepp" not in line
               for line in md.splitlines())  # dvse was trained but not evaluated with FR
    assert "rep_dvse: no FR grid yet" in md
    assert "No seed paper reports results on `synth`" in md


def test_attention_maps_are_probabilities_over_regions(tiny_project):
    import torch

    from xmr.report.figures import image_attention
    from xmr.inference.loaders import load_split_with_features
    from xmr.inference.model import load_trained

    model, cfg = load_trained(tiny_project["runs"] / "synth" / "rep_dvse")
    data, feats = load_split_with_features(run_settings(cfg).image, cfg["dataset_cfg"], "test")
    n = int(feats.num_regions[0])
    attn, mask = image_attention(model, torch.from_numpy(np.asarray(feats[0][:n]))[None], torch.tensor([n]))
    assert attn.shape == (1, 2, n) and np.allclose(attn.sum(-1), 1.0, atol=1e-5) and (attn >= 0).all()
    assert mask.shape == (1, 2) and set(np.unique(mask)) <= {0.0, 1.0}


def test_attention_to_pixels_grid_and_boxes():
    from xmr.report.figures import attention_to_pixels

    heat = attention_to_pixels(np.array([1.0, 0.0, 0.0, 0.0]), (40, 40))  # 2x2 grid, top-left cell only
    assert heat.shape == (40, 40)
    assert heat[:20, :20].sum() > 10 * heat[20:, 20:].sum()
    boxes = np.array([[0, 0, 2, 2], [1, 1, 3, 3]], dtype=float)
    heat = attention_to_pixels(np.array([0.5, 0.25]), (4, 4), boxes)
    want = np.zeros((4, 4))
    want[0:2, 0:2] += 0.5
    want[1:3, 1:3] += 0.25
    assert np.allclose(heat, want)
    with pytest.raises(XmrError, match="not a square grid"):
        attention_to_pixels(np.ones(6), (10, 10))


def test_figures_are_logged_to_their_mlflow_runs(tmp_path, monkeypatch):
    from xmr.report.build import Block, Report, Section, log_report_to_mlflow
    from xmr.report.figures import plot_training_curves
    from xmr.run.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = Tracker(True)
    with tracker.run("xmr/synth", "m"):
        run_id = tracker.run_id
    run = tmp_path / "runs" / "synth" / "m"
    run.mkdir(parents=True)
    (run / "train.json").write_text(json.dumps({"mlflow_run_id": run_id, "experiment": "xmr/synth", "recipe": "m"}))
    saved = yaml.safe_load((Path(__file__).parent / "fixtures" / "old_run" / "vsepp" / "config.yaml").read_text())
    saved["tracking"]["enabled"] = True  # a run's config.yaml, as the trainer writes it, with tracking on
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    png = tmp_path / "curves.png"
    plot_training_curves({"m": [{"epoch": 1.0, "loss": 2.0, "val_rsum": 10.0}]}, png)
    page = tmp_path / "report.html"
    page.write_text("<html></html>")
    report = Report("t", ["synth"], [Section("s", [Block("figure", "c", path=png, run_dir=run)])])
    log_report_to_mlflow(report, [page])
    client = tracker.mlflow.MlflowClient()
    assert [a.path for a in client.list_artifacts(run_id, "report")] == ["report/curves.png"]
    assert client.get_run(run_id).info.status == "FINISHED"  # the figure is added, the run is not reopened
    exp = client.get_experiment_by_name("xmr/synth/reports")  # apart from the training runs of xmr/synth
    assert client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id],
                              "attributes.run_name = 'report'") == []
    runs = client.search_runs([exp.experiment_id], "attributes.run_name = 'report'")
    assert len(runs) == 1
    assert sorted(a.path for a in client.list_artifacts(runs[0].info.run_id, "report")) == [
        "report/curves.png", "report/report.html"]
    log_report_to_mlflow(report, [page])  # the next report reuses the `report` run
    assert len(client.search_runs([exp.experiment_id], "attributes.run_name = 'report'")) == 1


def test_report_settings_are_written_once_in_the_file(tmp_path):
    """config/report.yaml's `default` holds every setting (no second copy in code): a file missing one is an error
    naming it, and a dataset entry overrides only what it sets."""
    from xmr.core.errors import XmrError
    from xmr.report.settings import report_settings

    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "report.yaml").read_text())
    (tmp_path / "report.yaml").write_text(yaml.safe_dump(shipped))
    synth = report_settings("synth", tmp_path)
    assert synth["experiments"] == shipped["datasets"]["synth"]["experiments"]
    assert synth["fr_grid"] == shipped["default"]["fr_grid"]  # not overridden for synth
    del shipped["default"]["curves"]
    (tmp_path / "report.yaml").write_text(yaml.safe_dump(shipped))
    with pytest.raises(XmrError, match="report.yaml: missing required key 'default.curves'"):
        report_settings("synth", tmp_path)
    with pytest.raises(XmrError, match="report.yaml: not found"):
        report_settings("synth", tmp_path / "elsewhere")


def test_report_shows_every_results_file_and_leaves_out_sections_of_untrained_recipes(tiny_project, tmp_path):
    """`xmr report --dataset synth`: a recipe results file that config/report.yaml does not list (the demo's
    dvse_demo*.json) is in the table, and the FR-grid and sub-embedding sections of recipes trained nowhere here
    (DVSE's, on a dataset of one's own) are left out, not notes saying "not trained"."""
    import shutil

    from conftest import run_xmr

    config = tmp_path / "config"
    shutil.copytree(tiny_project["config"], config)
    report = yaml.safe_load((config / "report.yaml").read_text())
    report["default"].update(methods=["rep_vsepp"], fr_grid={**report["default"]["fr_grid"], "recipes": ["rep_pcme"]},
                             subembeddings={**report["default"]["subembeddings"], "recipes": ["rep_pcme"]})
    (config / "report.yaml").write_text(yaml.safe_dump(report))
    results = tmp_path / "results"
    shutil.copytree(tiny_project["results"] / "synth", results / "synth", ignore=shutil.ignore_patterns("fr_grid"))
    (results / "synth" / "summary.json").write_text("{}")  # not a recipe's: left out
    r = run_xmr("report", "--dataset", "synth", "--out-dir", tmp_path / "rep", "--config-dir", config,
                "--results-root", results, "--runs-root", tiny_project["runs"], "--no-tracking", check=True)
    md = (tmp_path / "rep" / "report.md").read_text()
    dvse = json.loads((results / "synth" / "rep_dvse.json").read_text())
    row = next(line for line in md.splitlines() if line.startswith("| dvse | rep_dvse | plain |"))
    assert f"{dvse['rsum']:.1f}" in row  # not listed in methods:, shown all the same
    assert "FR scale sensitivity" not in md and "Sub-embeddings" not in md and "rep_pcme" not in md, md
    assert "## Retrieval examples" in md and "## Training curves" in md
    assert "rep_dvse" in (tmp_path / "rep" / "report.html").read_text() and "notes)" in r.stdout


def test_one_epoch_curves_and_partial_bar_charts_are_laid_out_for_what_is_there():
    from xmr.report.experiment_table import bar_rerankers
    from xmr.report.figures import epoch_axis

    assert epoch_axis([1.0]) == ((0.5, 1.5), [1])  # one point at tick 1, not ticks 0.96 ... 1.04
    assert epoch_axis([1.0, 2.0, 3.0]) == ((0.5, 3.5), [1, 2, 3])
    assert epoch_axis([float(e) for e in range(1, 31)]) == ((0.5, 30.5), list(range(1, 31, 3)))
    assert epoch_axis([]) is None
    # fr_all_methods' seven re-rankers, of which two have results: two legend entries, in the experiment's order
    by_variant = {"vsepp": {"fr": {"RSUM": 20.0}, "none": {"RSUM": 10.0}, "rr": {"RSUM": None}}, "dvse": {}}
    assert bar_rerankers(["none", "fr", "rr", "isoftmax", "dsl", "qbnorm", "csls"], by_variant) == ["none", "fr"]
