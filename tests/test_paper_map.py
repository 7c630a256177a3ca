"""The reproduction map (xmr/report/paper_map.yaml, `xmr papers`, docs/papers.md): every table and figure of the
five papers is listed and checked against a paper's text, every target it names plans on a clean checkout, and no
recipe named anywhere in the repository is missing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO, run_xmr, xmr_env

FIXTURE = REPO / "tests" / "fixtures" / "paper_texts" / "sample.txt"


def shipped_map() -> dict:
    from xmr.report.papers import load_paper_map

    return load_paper_map()


def test_table_and_figure_ids_are_read_from_a_text_as_the_papers_number_them():
    from xmr.report.papers import text_ids

    assert text_ids(FIXTURE.read_text()) == [
        "Table VI", "Table I", "Table II", "Fig. 10", "Fig. 5.1", "Table A.1-1", "Fig. A.2-1", "Table C-2", "Fig. C-2",
        "Table A1", "Table 5.5"]


def texts_of(doc: dict, folder: Path) -> Path:
    """A stand-in text per paper: each item's id and recorded words, as a caption would print them."""
    folder.mkdir()
    for paper in doc["papers"]:
        lines = [f"{it['id']}. {it['words']} ..." for it in paper["items"]]
        (folder / paper["text"]).write_text("\n".join(lines) + "\n")
    return folder


def test_check_against_the_texts_fails_on_a_table_the_map_lacks_and_on_words_a_text_lacks(tmp_path):
    texts = texts_of(shipped_map(), tmp_path / "texts")
    r = run_xmr("papers", "--check-against", texts)
    assert r.returncode == 0 and "agree with the texts" in r.stdout, r.stdout + r.stderr
    dvse = texts / "dvse.txt"
    dvse.write_text(dvse.read_text() + "TABLE VII A table this map has never heard of.\n")
    dive = texts / "dive.txt"
    dive.write_text(dive.read_text().replace("Ablation studies of the proposed similarity", "Ablations"))
    (texts / "rrf_thesis.txt").unlink()
    r = run_xmr("papers", "--check-against", texts)
    assert r.returncode == 1
    assert "dvse.txt names Table VII, which the map's dvse items lack" in r.stderr
    assert "dive.txt: Table 3: the words 'Ablation studies of the proposed similarity function" in r.stderr
    assert "rrf_thesis.txt: not found" in r.stderr
    assert "3 problem(s)" in r.stderr


def test_every_paper_lists_the_tables_and_figures_its_text_names():
    """What the map's tables and figures are: the ids the five texts name (recorded when they were checked with
    `xmr papers --check-against`), each paper's list of items in the map."""
    doc = shipped_map()
    ids = {p["key"]: [it["id"] for it in p["items"]] for p in doc["papers"]}
    assert ids["dvse"] == ["Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Table I", "Table II", "Table III",
                           "Table IV", "Table V", "Table VI", "Fig. 6", "Fig. 7", "Fig. 8", "Fig. 9", "Fig. 10",
                           "Fig. 11", "Fig. 12"]
    assert set(ids["vse_2ad"]) == {"Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 1", "Table 2", "Table 3", "Table 4",
                                   "Table A.1-1", "Fig. A.2-1", "Fig. C-2", "Table C-2"}
    assert set(ids["coder"]) == {"Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 1", "Table 2", "Table 3", "Table 4"}
    assert set(ids["dive"]) == {"Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 1", "Table 2", "Table 3", "Table 4",
                                "Table 5", "Table A1", "Fig. A1", "Fig. A2", "Fig. A3", "§B.3"}
    assert set(ids["rrf"]) == {f"Fig. 5.{i}" for i in range(1, 6)} | {f"Table 5.{i}" for i in range(1, 6)}


def test_every_target_of_the_map_plans_with_one_dry_run_and_everything_it_names_exists():
    r = run_xmr("papers", "--check-targets", cwd=REPO)
    assert r.returncode == 0, r.stderr
    from xmr.report.papers import map_targets

    targets = [t for t in map_targets(shipped_map()) if not t.startswith("benchmarks/")]
    # -F: plan every job even where this checkout has made some already (a clean checkout plans them all)
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-n", "-F", "--nolock", "-c2", *targets]
    p = subprocess.run(cmd, cwd=REPO, env=xmr_env(), capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    for rule in ("rule ensemble:", "rule experiment_table:", "rule fr_grid:", "rule report:", "rule train:"):
        assert rule in out, rule
    # RRF's Table 5.5 trains the four single models its three ensembles average, no ensemble of its own
    assert "results/f30k/exp/rrf_ensemble_f30k/table.md implies 4 trainings" in out


def test_docs_papers_page_is_the_generated_map(tmp_path):
    r = run_xmr("papers", "--no-results", "--markdown-out", tmp_path / "papers.md")
    assert r.returncode == 0, r.stderr
    assert (REPO / "docs" / "papers.md").read_text() == (tmp_path / "papers.md").read_text(), \
        "regenerate: xmr papers --no-results --markdown-out docs/papers.md"


def test_xmr_papers_shows_xmr_number_beside_the_papers(tmp_path):
    res = tmp_path / "results" / "coco"
    res.mkdir(parents=True)
    (res / "dvse.json").write_text(json.dumps({"protocol": "coco1k", "protocols": {
        "coco1k": {"rsum": 512.25}, "coco5k": {"rsum": 401.0}}}))
    r = run_xmr("papers", "--results-root", tmp_path / "results")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("| Table I | Faster R-CNN + Bi-GRU"))
    # the paper's (DVSE Table I) and xmr's, each protocol
    assert "dvse coco1k 523.0<br>dvse coco5k 429.3" in row and "dvse coco1k 512.2, coco5k 401.0" in row


# --- no recipe named anywhere is missing -------------------------------------------------------------------------

#: a name the repository prints on purpose as one that does not exist (the example of a typo in a docstring)
NOT_RECIPES = {("xmr/planning/workflow_inputs.py", "results/synth/vsep.json")}


def named_targets() -> list[tuple[str, str]]:
    """(file, `config/recipes/{dataset}/{name}.yaml` or `results/{dataset}/{name}.json`) for every such path the
    repository's own files (not the tests, which make their own) print, on the datasets it ships."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    pattern = re.compile(r"(?<![\w/])(config/recipes/([a-z0-9]+)/[a-z0-9_]+\.yaml|results/([a-z0-9]+)/[a-z0-9_]+\.json)")
    datasets = {p.stem for p in (REPO / "config" / "datasets").glob("*.yaml")}
    found = []
    for f in files:
        if f.startswith("tests/") or not f.endswith((".md", ".yaml", ".py", ".smk", ".cfg", ".toml")) and f != "Makefile":
            continue
        for m in pattern.finditer((REPO / f).read_text(errors="replace")):
            if (m.group(2) or m.group(3)) in datasets and (f, m.group(1)) not in NOT_RECIPES:
                found.append((f, m.group(1)))
    return found


def test_no_recipe_named_anywhere_in_the_repository_is_missing():
    from xmr.core.errors import XmrError
    from xmr.report.paper import paper_entries
    from xmr.run.layout import parse_target, split_results_target
    from xmr.studies.ensembles import list_ensembles, load_ensemble
    from xmr.studies.experiments import list_experiments

    missing = []
    for f, path in named_targets():
        if path.startswith("config/"):
            if not (REPO / path).is_file():
                missing.append(f"{f}: {path}")
            continue
        try:
            parse_target(*split_results_target(path), REPO / "config")
        except XmrError as e:
            if not path.endswith(("/summary.json", "/benchmark.json")):
                missing.append(f"{f}: {e}")
    for e in paper_entries():  # the papers' numbers: each setting's recipe or ensemble
        if not any((REPO / "config" / kind / e["dataset"] / f"{e['recipe']}.yaml").is_file()
                   for kind in ("recipes", "ensembles")):
            missing.append(f"xmr/report/paper_results.yaml: {e['dataset']}/{e['recipe']} ({e['source']})")
    for exp in list_experiments(REPO / "config"):  # an experiment's recipe(s), on each dataset it is meant for
        for dataset in exp.datasets:
            names = [exp.recipe] if exp.recipe else list(exp.variants)
            missing += [f"{exp.path}: {dataset}/{n}" for n in names
                        if not any((REPO / "config" / k / dataset / f"{n}.yaml").is_file() for k in ("recipes", "ensembles"))
                        and (exp.recipe or exp.name != "fr_all_methods")]
    for dataset, name in list_ensembles(REPO / "config"):  # members are recipes (checked as it loads)
        load_ensemble(dataset, name, REPO / "config")
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    report = yaml.safe_load((REPO / "config" / "report.yaml").read_text())
    listed = [(cfg["default"]["dataset"], t) for t in cfg["default"]["targets"]]
    listed += [(d, t) for d, ts in (cfg.get("summary_targets") or {}).items() for t in ts if d != "default"]
    listed += [(d, m) for d, s in (report.get("datasets") or {}).items() for m in s.get("methods") or []]
    for dataset, target in listed:
        try:
            parse_target(dataset, target, REPO / "config")
        except XmrError as e:
            missing.append(f"config: {e}")
    assert not missing, "\n".join(missing)
