"""DVC around the Snakemake pipeline, in a temp git repository made from a copy of this one (tiny synth sizes):
`make demo`'s Snakemake targets, stopped once by Ctrl-C while DVSE trains and run again (the training log keeps
both runs' epochs), then `dvc repro` of the demo's stages (train@synth-dvse_demo, rerank@synth-dvse_demo_fr), which has
nothing to rebuild, and of vsepp's; `dvc metrics show`, `dvc plots show`, `dvc params diff` with content;
`dvc exp run -S` on one recipe's parameter retraining that recipe only; a `dvc push` / `dvc pull` round trip
through the default remote after which `make sync` leaves Snakemake nothing to do. No assertion depends on what
synth training reaches (only on files and their agreement), so changes to the synth generator and recipes do not
break it."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from .helpers import BIN, REPO, copy_repo, default_sigint, make_tiny, run, stop_group, tool_env

pytestmark = pytest.mark.integration

GIT_ID = {"GIT_AUTHOR_NAME": "xmr test", "GIT_AUTHOR_EMAIL": "test@xmr", "GIT_COMMITTER_NAME": "xmr test",
          "GIT_COMMITTER_EMAIL": "test@xmr"}
RECIPES = ("vsepp", "dvse_demo")
TARGETS = ["results/synth/vsepp.json", "results/synth/dvse_demo.json", "results/synth/dvse_demo_fr.json"]
METRICS = [t.replace(".json", ".metrics.json") for t in TARGETS]  # the compact files DVC shows as metrics
RUN_FILES = ("best.pt", "config.yaml", "train.json", "test_sims.npy", "history.csv")  # what a train stage tracks
VSEPP = "config/recipes/synth/vsepp.yaml"
DEMO_STAGES = ("train@synth-dvse_demo", "rerank@synth-dvse_demo_fr")
DEMO_FEATURES_STAGE = "features@synth-efficientnet_lite0_96"  # the demo recipe's image features
DEMO_FILES = ("data/synth", "features/synth", "runs/synth/dvse_demo", "results/synth")  # what the demo writes


def dvc(*args: str) -> list[str]:
    return [str(BIN / "dvc"), *args]


def tracked_files(root: Path) -> list[str]:
    files = [f"runs/synth/{r}/{f}" for r in RECIPES for f in RUN_FILES] + TARGETS + METRICS
    files += [str(p.relative_to(root)) for top in ("data/synth", "features/synth")
              for p in sorted((root / top).rglob("*")) if p.is_file() and p.name != ".gitignore"]
    return files


def file_hashes(root: Path) -> dict[str, str]:
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in tracked_files(root)}


def flat_numbers(doc: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(flat_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def demo_targets() -> list[str]:
    """The Snakemake targets `make demo` builds (the Makefile's DEMO_TARGET)."""
    line = next(ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("DEMO_TARGET ?="))
    return line.split("?=", 1)[1].split()


def mtimes(root: Path, tops: tuple[str, ...]) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for top in tops for p in sorted((root / top).rglob("*"))
            if p.is_file()}


def run_demo_with_one_ctrl_c(root: Path, env: dict[str, str]) -> None:
    """`make demo`'s Snakemake run, stopped by Ctrl-C (SIGINT to its process group, as a terminal sends it) once
    DVSE has finished its first epoch, then the same command again to its end, with --rerun-incomplete, as
    Snakemake asks after a Ctrl-C (the SLURM profile always adds it)."""
    demo = [str(BIN / "snakemake"), "--cores", "2", *demo_targets()]
    log, last = root / "logs" / "train" / "synth_dvse_demo.log", root / "runs" / "synth" / "dvse_demo" / "last.pt"
    proc = subprocess.Popen(demo, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=default_sigint)
    deadline = time.time() + 600
    while not (last.exists() and log.exists() and "epoch 1/" in log.read_text()):
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError(f"the demo ended before DVSE's first epoch:\n{stop_group(proc)[-3000:]}")
        time.sleep(0.05)
    interrupted = stop_group(proc)
    (root.parent / "interrupted_output.txt").write_text(interrupted)
    # a Ctrl-C that came only after the demo's last job leaves nothing to resume: say so, not an unpacking error
    assert "(100%) done" not in interrupted, "the Ctrl-C came after the demo had ended; nothing was interrupted"
    run([*demo, "--rerun-incomplete"], root, env, timeout=900)


def shrink_dvc_yaml(root: Path) -> None:
    """Keep the stages of the tiny recipes (the copy trains only those): the demo's two and vsepp, and the data
    stages (RRF's HGLMM caption features too, until :func:`drop_text_features_stage`)."""
    path = root / "dvc.yaml"
    doc = yaml.safe_load(path.read_text())
    for var in doc["vars"]:
        if "train" in var:
            var["train"] = {k: v for k, v in var["train"].items() if v["dataset"] == "synth" and v["recipe"] in RECIPES}
            assert len(var["train"]) == len(RECIPES)
        if "rerank" in var:
            var["rerank"] = {k: v for k, v in var["rerank"].items() if k == "synth-dvse_demo_fr"}
    for plot in doc.get("plots", []):
        for definition in plot.values():
            definition["y"] = {f: c for f, c in definition["y"].items() if f.split("/")[2] in RECIPES}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def drop_text_features_stage(root: Path) -> None:
    """No stage of the copy reads RRF's HGLMM caption features: building them would be a quarter of a `dvc repro`."""
    path = root / "dvc.yaml"
    doc = yaml.safe_load(path.read_text())
    del doc["stages"]["text_features"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture(scope="module")
def dvc_repo(module_tmp) -> tuple[Path, dict[str, str]]:
    """A git repo of the project (tiny synth): the demo (one Ctrl-C, then run again), `dvc repro` of the demo's
    stages right after it (twice: outputs in demo_repro_*.txt, the demo's files' mtimes before and after in
    demo_mtimes.json), then `dvc repro` of everything, committed with its dvc.lock."""
    root = copy_repo(module_tmp("dvc") / "repo")
    make_tiny(root, RECIPES)
    shrink_dvc_yaml(root)
    env = tool_env(root, **GIT_ID)
    run(["git", "init", "-q", "-b", "main"], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-q", "-m", "project"], root, env)
    # the previews docs/pipeline.md gives for a clone with nothing built (`dvc repro --dry` of later stages cannot)
    (root.parent / "fresh_status.txt").write_text(run(dvc("status"), root, env).stdout)
    (root.parent / "fresh_dry_data.txt").write_text(run(dvc("repro", "--dry", "data@synth"), root, env).stdout)
    (root.parent / "fresh_dry_built.txt").write_text("data/synth" if (root / "data" / "synth").exists() else "nothing")
    run_demo_with_one_ctrl_c(root, env)
    before = mtimes(root, DEMO_FILES)
    for name in ("first", "again"):
        out = run(dvc("repro", *DEMO_STAGES), root, env, timeout=900).stdout
        (root.parent / f"demo_repro_{name}.txt").write_text(out)
    (root.parent / "demo_mtimes.json").write_text(json.dumps({"before": before, "after": mtimes(root, DEMO_FILES)}))
    drop_text_features_stage(root)
    run(["git", "commit", "-q", "-am", "no RRF"], root, env)
    repro = run(dvc("repro"), root, env, timeout=900)
    (root.parent / "repro_output.txt").write_text(repro.stdout + repro.stderr)  # what the terminal showed
    run(["git", "add", "dvc.lock"], root, env)
    run(["git", "commit", "-q", "-m", "dvc repro"], root, env)
    status = run(dvc("status"), root, env).stdout
    assert "Data and pipelines are up to date." in status, status
    return root, env


def test_what_dvc_would_run_on_a_clone_with_nothing_built(dvc_repo):
    root, _ = dvc_repo
    status = (root.parent / "fresh_status.txt").read_text()
    for stage in ("data@synth", DEMO_FEATURES_STAGE, *DEMO_STAGES):
        assert f"{stage}:" in status, (stage, status[:3000])
    assert "deleted:            data/synth" in status
    dry = (root.parent / "fresh_dry_data.txt").read_text()
    assert "Running stage 'data@synth':\n> snakemake --cores 2 data/synth/dataset_synth.json" in dry, dry
    assert (root.parent / "fresh_dry_built.txt").read_text() == "nothing"  # a dry run builds nothing


def test_a_demo_stopped_by_ctrl_c_keeps_both_runs_epochs_in_its_training_log(dvc_repo):
    """`xmr train --log` appends to logs/train/*.log: the first run's epoch 1, the line saying the run resumed, then
    the rest (as the rule's `log:`, Snakemake deleted the file before the rerun, and the first epochs were gone)."""
    root, _ = dvc_repo
    lines = (root / "logs/train/synth_dvse_demo.log").read_text().splitlines()
    epochs = [i for i, ln in enumerate(lines) if re.match(r"epoch \d+/2 ", ln) and "step=" not in ln]
    assert [lines[i].split()[1] for i in epochs] == ["1/2", "2/2"], lines
    (resumed,) = [i for i, ln in enumerate(lines) if ln.startswith("==== resuming runs/synth/dvse_demo after epoch ")]
    after = int(lines[resumed].split()[-2])  # Ctrl-C came after epoch 1 (or, rarely, right after epoch 2)
    assert epochs[after - 1] < resumed and all(resumed < i for i in epochs[after:]), lines


def test_dvc_repro_of_the_demos_stages_right_after_the_demo_rebuilds_nothing(dvc_repo):
    """`dvc repro train@synth-dvse_demo rerank@synth-dvse_demo_fr` after `make demo` built RRF's HGLMM caption features (the
    data stage's) and re-evaluated dvse_demo_fr (DVC had written the run's files again, newer than dvse_fr.json);
    the demo's stages need its own features only, not the other recipes' (another backbone's folder)."""
    root, _ = dvc_repo
    first = (root.parent / "demo_repro_first.txt").read_text()
    for stage in ("data@synth", DEMO_FEATURES_STAGE, *DEMO_STAGES):  # each runs its targets, which are up to date
        assert f"Running stage '{stage}'" in first, first[-3000:]
    assert "text_features@synth" not in first and "hglmm" not in first, first[-3000:]
    assert "features@synth-efficientnet_lite0_128" not in first, first[-3000:]
    assert first.count("Nothing to be done") == 4 and not re.search(r"^(local)?rule \w+:", first, flags=re.M), first
    stamps = json.loads((root.parent / "demo_mtimes.json").read_text())
    assert stamps["after"] == stamps["before"] and "results/synth/dvse_demo_fr.json" in stamps["before"]
    assert not any("hglmm" in f for f in stamps["after"])
    again = (root.parent / "demo_repro_again.txt").read_text()
    assert "Data and pipelines are up to date." in again and "Running stage" not in again, again


def test_training_through_snakemake_logs_one_line_per_epoch(dvc_repo):
    """The workflow runs `xmr train --no-progress > log`: the log still has loss, validation RSUM and samples/s
    for every epoch."""
    from xmr.core.progress import parse_line

    root, _ = dvc_repo
    epochs = yaml.safe_load((root / VSEPP).read_text())["train"]["epochs"]
    lines = (root / "logs/train/synth_vsepp.log").read_text().splitlines()
    per_epoch = [parse_line(ln) | {"head": ln.split()[1]} for ln in lines
                 if ln.startswith("epoch ") and "step=" not in ln]
    assert [e["head"] for e in per_epoch] == [f"{k}/{epochs}" for k in range(1, epochs + 1)]
    for e in per_epoch:
        assert float(e["loss"]) > 0 and float(e["val_rsum"]) >= 0 and float(e["samples_per_s"]) > 0
    # and the terminal shows them as they come (`make demo` is not silent for the minutes of training)
    shown = (root.parent / "repro_output.txt").read_text().splitlines()
    logged = [ln for ln in lines if ln.startswith("epoch ") and "step=" not in ln]
    assert logged and set(logged) <= set(shown), shown[-40:]


def test_metrics_plots_and_params_have_content(dvc_repo, tmp_path):
    root, env = dvc_repo
    shown = json.loads(run(dvc("metrics", "show", "--json"), root, env).stdout)
    (workspace,) = shown.values()  # the workspace only (its key is "" or "workspace" depending on the version)
    metrics = workspace["data"]  # per metrics file: what the file holds
    assert sorted(metrics) == sorted(METRICS)  # the compact files only, not the full results JSON
    for target, compact in zip(TARGETS, METRICS):  # every number of the compact file, equal to the full JSON's
        numbers = flat_numbers(metrics[compact]["data"])
        assert numbers == flat_numbers(json.loads((root / compact).read_text()))
        full = flat_numbers(json.loads((root / target).read_text())["protocols"])
        assert all(full[k] == v for k, v in numbers.items())
        assert "plain.rsum" in numbers and "plain.i2t.r1" in numbers and len(numbers) <= 30
    table = run(dvc("metrics", "show"), root, env).stdout  # readable: one header line of at most ~30 columns
    header = next(ln for ln in table.splitlines() if ln.strip().startswith("Path"))
    assert len(header.split()) <= 30 and "plain.rsum" in header, table

    out = tmp_path / "plots"
    run(dvc("plots", "show", "-o", str(out)), root, env, timeout=300)
    html = (out / "index.html").read_text()
    for recipe in RECIPES:  # each recipe's validation RSUM (stage plot) and the loss chart over recipes
        assert f"{recipe}/history.csv" in html  # (the HTML escapes some slashes)
    assert "val_rsum" in html and '"loss"' in html and "epoch" in html

    # params diff: every recipe param of the tracked recipes, with its value in the recipe file
    params = json.loads(run(dvc("params", "diff", "--all", "--json"), root, env).stdout)
    recipe = yaml.safe_load((root / VSEPP).read_text())
    lr = params[VSEPP]["optim.lr"]
    assert (lr["old"], lr["new"]) == (recipe["optim"]["lr"], recipe["optim"]["lr"])
    assert "config/recipes/synth/dvse_demo.yaml" in params and "config/rerank/fr.yaml" in params


def test_experiment_on_one_recipe_retrains_only_that_recipe(dvc_repo):
    root, env = dvc_repo
    before = {f: ((root / f).stat().st_mtime_ns, h) for f, h in file_hashes(root).items()}
    try:
        out = run(dvc("exp", "run", "-S", f"{VSEPP}:optim.lr=0.001"), root, env, timeout=900).stdout
        assert "Running stage 'train@synth-vsepp'" in out, out[-3000:]
        for other in ("data@synth", DEMO_FEATURES_STAGE, "features@synth-efficientnet_lite0_128",
                      "train@synth-dvse_demo", "rerank@synth-dvse_demo_fr"):
            assert f"Running stage '{other}'" not in out
        after = {f: ((root / f).stat().st_mtime_ns, h) for f, h in file_hashes(root).items()}
        retrained = {f for f in before if before[f] != after[f]}
        # vsepp's run and results were rewritten; nothing of the data, dvse_demo or dvse_demo_fr was touched
        assert {f"runs/synth/vsepp/{f}" for f in ("best.pt", "config.yaml", "train.json")} <= retrained
        assert all(f.startswith(("runs/synth/vsepp/", "results/synth/vsepp.")) for f in retrained), retrained
        assert yaml.safe_load((root / "runs/synth/vsepp/config.yaml").read_text())["optim"]["lr"] == 0.001

        # params diff HEAD -> workspace: exactly the changed parameter
        diff = json.loads(run(dvc("params", "diff", "--json"), root, env).stdout)
        assert list(diff) == [VSEPP] and diff[VSEPP]["optim.lr"]["new"] == 0.001

        # dvc exp show: the experiment with its param and vsepp's metrics; its MLflow run carries its name
        shown = json.loads(run(dvc("exp", "show", "--json"), root, env).stdout)
        (head,) = [r for r in shown if r.get("rev") != "workspace"]
        (exp,) = [rev for e in head["experiments"] for rev in e["revs"]]
        assert exp["data"]["params"][VSEPP]["data"]["optim"]["lr"] == 0.001
        assert flat_numbers(exp["data"]["metrics"]["results/synth/vsepp.metrics.json"]["data"]) == flat_numbers(
            json.loads((root / "results/synth/vsepp.metrics.json").read_text()))
        # docs/pipeline.md's compact form: only the columns that differ (the full table is every recipe's params)
        full, compact = (run(dvc("exp", "show", "--csv", *extra), root, env).stdout.splitlines()[0].split(",")
                         for extra in ((), ("--only-changed",)))
        # (DVC names a column by its key alone where no other params file of the table has that key)
        assert any(c.split(":")[-1] == "optim.lr" for c in compact) and len(compact) < 40 < len(full), (len(full),
                                                                                                    compact)
        import mlflow

        client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
        runs = client.search_runs([client.get_experiment_by_name("xmr/synth").experiment_id],
                                  order_by=["attributes.start_time DESC"])
        assert runs[0].data.tags.get("dvc_exp_name") == exp["name"] and runs[0].data.params["optim.lr"] == "0.001"
    finally:
        # back to the committed state for any later test on this repo
        run(["git", "checkout", "-q", "--", "."], root, env)
        run(dvc("checkout", "--force"), root, env, timeout=300)


def test_push_pull_round_trip_then_sync_leaves_snakemake_nothing_to_do(dvc_repo, tmp_path):
    root, env = dvc_repo
    run(dvc("push"), root, env, timeout=300)  # the shipped default remote: dvcstore/ inside the project
    assert any((root / "dvcstore").rglob("*")), "dvc push wrote nothing to the default remote"

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(root), str(clone)], tmp_path, env)
    assert not (clone / "runs").exists()
    # a clone shares the store by pointing its remote at it (docs/pipeline.md, "Remote")
    run(dvc("remote", "modify", "--local", "store", "url", str(root / "dvcstore")), clone, env)
    run(dvc("pull"), clone, env, timeout=300)
    assert file_hashes(clone) == file_hashes(root) and len(file_hashes(root)) > 10

    # DVC restores files in no particular order, so their mtimes say nothing about what is up to date;
    # `make sync` (dvc checkout + snakemake --touch on the stages' targets) fixes that without running anything
    run(["make", "sync"], clone, env, timeout=300)
    out = run([str(BIN / "snakemake"), "-n", *TARGETS], clone, env, timeout=300).stdout
    assert "Nothing to be done" in out, out[-3000:]
    assert file_hashes(clone) == file_hashes(root)  # touched, not rewritten
    assert "Data and pipelines are up to date." in run(dvc("status"), clone, env).stdout
