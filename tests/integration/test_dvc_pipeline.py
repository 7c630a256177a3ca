"""DVC around the Snakemake pipeline, in a temp git repository made from a copy of this one (tiny synth sizes):
`dvc repro`, an experiment on a recipe param compared with `dvc metrics diff` / `dvc exp show` / `dvc plots
show`, and a `dvc push` / `dvc pull` round trip through the local remote after which `make sync` leaves
Snakemake nothing to do."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml

from .helpers import BIN, copy_repo, make_tiny, run, tool_env

pytestmark = pytest.mark.integration

GIT_ID = {"GIT_AUTHOR_NAME": "xmr test", "GIT_AUTHOR_EMAIL": "test@xmr", "GIT_COMMITTER_NAME": "xmr test",
          "GIT_COMMITTER_EMAIL": "test@xmr"}
OUTS = ("data/synth", "features/synth", "runs/synth", "results/synth")  # dvc.yaml stage `synth` outs
SUMMARY = "results/synth/summary.json"


def dvc(*args: str) -> list[str]:
    return [str(BIN / "dvc"), *args]


def file_hashes(root: Path) -> dict[str, str]:
    out = {}
    for top in OUTS:
        for p in sorted((root / top).rglob("*")):
            if p.is_file() and p.name != ".gitignore":
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def flat_metrics(doc: dict, prefix: str = "") -> dict[str, float]:
    """summary.json -> {"vsepp.RSUM": ..} (the keys `dvc metrics diff` reports; numbers only)."""
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(flat_metrics(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)):
            out[f"{prefix}{k}"] = v
    return out


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A git repo of the project (tiny synth), reproduced with `dvc repro` and committed with its dvc.lock."""
    root = copy_repo(tmp_path_factory.mktemp("dvc") / "repo")
    make_tiny(root)
    cfg_path = root / "config" / "config.yaml"  # the summary of one recipe keeps `dvc repro` to seconds of CPU
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["summary_targets"]["synth"] = ["vsepp"]
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = tool_env(root, **GIT_ID)
    run(["git", "init", "-q", "-b", "main"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-q", "-m", "project"], root, env)
    run(dvc("repro"), root, env, timeout=900)
    run(["git", "add", "dvc.lock"], root, env)
    run(["git", "commit", "-q", "-m", "dvc repro"], root, env)
    status = run(dvc("status"), root, env).stdout
    assert "Data and pipelines are up to date." in status, status
    return root, env


def test_push_pull_round_trip_then_sync_leaves_snakemake_nothing_to_do(dvc_repo, tmp_path):
    root, env = dvc_repo
    run(dvc("push"), root, env, timeout=300)  # the shipped default remote: ./dvcstore beside the repo root
    assert any((root / "dvcstore").rglob("*")), "dvc push wrote nothing to the local remote"

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    assert not (clone / "runs").exists()
    # a clone shares the store by pointing its remote at it (docs/pipeline.md)
    run(dvc("remote", "modify", "--local", "store", "url", str(root / "dvcstore")), clone, env)
    run(dvc("pull"), clone, env, timeout=300)
    assert file_hashes(clone) == file_hashes(root) and len(file_hashes(root)) > 10

    # DVC restores files in no particular order, so their mtimes say nothing about what is up to date;
    # `make sync` (dvc checkout + snakemake --touch) fixes that without running anything
    run(["make", "sync"], clone, env, timeout=300)
    out = run([str(BIN / "snakemake"), "-n", SUMMARY], clone, env, timeout=300).stdout
    assert "Nothing to be done" in out, out[-3000:]
    assert file_hashes(clone) == file_hashes(root)  # touched, not rewritten
    assert "Data and pipelines are up to date." in run(dvc("status"), clone, env).stdout


def test_experiment_on_a_recipe_param_is_compared_by_dvc(dvc_repo):
    root, env = dvc_repo
    baseline = flat_metrics(json.loads((root / SUMMARY).read_text()))
    run(dvc("exp", "run", "-S", "config/recipes/synth/vsepp.yaml:optim.lr=0.001"), root, env, timeout=900)
    try:
        # the recipe changed, so Snakemake retrained with it
        assert yaml.safe_load((root / "runs/synth/vsepp/config.yaml").read_text())["optim"]["lr"] == 0.001
        variant = flat_metrics(json.loads((root / SUMMARY).read_text()))

        # dvc metrics diff (HEAD -> workspace): exactly the changed metrics, with both values
        diff = json.loads(run(dvc("metrics", "diff", "--json"), root, env).stdout).get(SUMMARY, {})
        changed = {k for k in baseline if baseline[k] != variant[k]}
        assert set(diff) == changed
        for k in changed:
            assert (diff[k]["old"], diff[k]["new"]) == (baseline[k], variant[k])

        # dvc exp show: the experiment with its param and metrics; its MLflow run carries its name
        shown = json.loads(run(dvc("exp", "show", "--json"), root, env).stdout)
        (head,) = [r for r in shown if r.get("rev") != "workspace"]
        (exp,) = [rev for e in head["experiments"] for rev in e["revs"]]
        params = exp["data"]["params"]["config/recipes/synth/vsepp.yaml"]["data"]
        assert params["optim"]["lr"] == 0.001
        assert flat_metrics(exp["data"]["metrics"][SUMMARY]["data"]) == variant
        import mlflow

        client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id],
                                  order_by=["attributes.start_time DESC"])
        assert runs[0].data.tags.get("dvc_exp_name") == exp["name"] and runs[0].data.params["optim.lr"] == "0.001"

        # dvc plots show: the training curves (runs/synth/vsepp/history.csv) rendered to HTML
        run(dvc("plots", "show", "-o", "plots"), root, env, timeout=300)
        html = (root / "plots" / "index.html").read_text()
        assert "val_rsum" in html and "history.csv" in html
    finally:
        # back to the committed state for any later test on this repo
        run(["git", "checkout", "-q", "--", "."], root, env)
        run(dvc("checkout"), root, env, timeout=300)
