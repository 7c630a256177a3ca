"""Helpers the Snakemake rules call (kept in the package so the Snakefile holds no logic)."""

from __future__ import annotations

from pathlib import Path

from xmr.errors import XmrError

RERANKERS = ("fr", "rr", "mr", "isoftmax", "dsl", "qbnorm", "csls")


def parse_target(dataset: str, target: str, config_dir: str | Path = "config") -> tuple[str, str | None]:
    """``results/{dataset}/{target}.json`` -> (recipe, reranker): ``dvse_fr`` is recipe ``dvse`` + FR unless a
    recipe file is literally called ``dvse_fr``."""
    recipes = Path(config_dir) / "recipes" / dataset
    if (recipes / f"{target}.yaml").exists():
        return target, None
    base, _, suffix = target.rpartition("_")
    if suffix in RERANKERS and (recipes / f"{base}.yaml").exists():
        return base, suffix
    known = sorted(p.stem for p in recipes.glob("*.yaml"))
    raise XmrError(f"no recipe for results/{dataset}/{target}.json: expected {recipes / (target + '.yaml')} "
                   f"(recipes for {dataset}: {', '.join(known) or 'none'}; re-ranker suffixes: {', '.join(RERANKERS)})")


def recipe_path(dataset: str, recipe: str, config_dir: str | Path = "config") -> str:
    return str(Path(config_dir) / "recipes" / dataset / f"{recipe}.yaml")


def recipe_features(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict:
    """What a recipe's training needs: backbone key, feature dir, image source and the dataset's splits."""
    from xmr.config import load_run_config

    cfg = load_run_config(recipe_path(dataset, recipe, config_dir))
    ds = cfg["dataset_cfg"]
    return {"backbone": cfg["features"]["backbone"], "dir": cfg["features"]["dir"],
            "source": cfg["features"]["source"], "splits": ["train", ds["val_split"], ds["test_split"]],
            "annotations": ds.get("annotations")}


def image_inputs(dataset: str, info: dict, splits: list[str]) -> list[str]:
    """The files the image side of ``splits`` is read from, for a :func:`recipe_features` ``info``: the feature
    files ``{dir}/{dataset}/{backbone}/{split}.h5``, or, end to end (``features.source: images``), the dataset's
    annotation file(s) (the image files are checked when training starts, as ``xmr extract`` does)."""
    if info.get("source") == "images":
        ann = info.get("annotations") or []
        return [ann] if isinstance(ann, str) else list(ann)
    return [f"{info['dir']}/{dataset}/{info['backbone']}/{s}.h5" for s in splits]


def recipe_image_inputs(dataset: str, recipe: str, splits: list[str] | str,
                        config_dir: str | Path = "config") -> list[str]:
    """:func:`image_inputs` of a recipe; ``splits``: split names, or ``train`` (train + val: training reads both)
    or ``score`` (the test split)."""
    info = recipe_features(dataset, recipe, config_dir)
    named = {"train": info["splits"][:2], "score": info["splits"][2:]}
    return image_inputs(dataset, info, named.get(splits, [splits]) if isinstance(splits, str) else splits)


def rerank_inputs(run_dir: str, reranker: str | None) -> dict[str, str]:
    """Files a re-ranker reads besides the similarity matrix, as ``{parameter: path}``: QB-Norm's query bank
    (rule ``score_bank``); none for the others."""
    if reranker == "qbnorm":
        return {k: f"{run_dir}/qbnorm_{k}.npy" for k in ("bank_i2t", "bank_t2i")}
    return {}


def rerank_options(run_dir: str, reranker: str | None) -> str:
    """The ``xmr test`` options selecting ``reranker`` (empty for plain evaluation)."""
    if not reranker:
        return ""
    files = rerank_inputs(run_dir, reranker)
    extra = " --rerank-param " + " ".join(f"{k}={v}" for k, v in files.items()) if files else ""
    return f"--rerank {reranker}{extra}"


# --- big targets say they are big ------------------------------------------------------------------------------

_ANNOUNCED: set[str] = set()


def planned_runs(dataset: str, recipes: list[str], experiments: list = (), runs_root: str = "runs") -> list[Path]:
    """The run directories (one training each) behind ``recipes`` of ``dataset`` plus the variants of
    ``experiments`` (:class:`xmr.experiments.Experiment`; a comparison of recipes trains the recipes themselves)."""
    runs = {Path(runs_root) / dataset / r for r in recipes}
    for exp in experiments:
        if dataset in exp.datasets:
            runs.update(exp.run_dir(dataset, v, runs_root) for v in exp.variants_for(dataset))
    return sorted(runs)


def training_count_message(target: str, run_dirs: list[Path]) -> str:
    """``TARGET implies N trainings (K done, M to run)`` (a training is done when its ``train.json`` exists)."""
    done = sum((Path(d) / "train.json").exists() for d in run_dirs)
    return (f"{target} implies {len(run_dirs)} trainings ({done} already trained, {len(run_dirs) - done} to run; "
            f"docs/pipeline.md, 'How big is a target')")


def announce_trainings(target: str, run_dirs: list[Path]) -> None:
    """Print :func:`training_count_message` once per target while Snakemake builds its DAG (dry runs too: the
    input functions that call this run before the job list is printed, unlike ``onstart``)."""
    if target in _ANNOUNCED:
        return
    _ANNOUNCED.add(target)
    import sys

    print(training_count_message(target, run_dirs), file=sys.stderr, flush=True)


# --- DVC ----------------------------------------------------------------------------------------------------------


# the snakemake options of a stage command that take a value (the next word is not a target)
_VALUE_OPTIONS = {"--cores", "-c", "--jobs", "-j", "--profile", "--configfile", "--directory", "-d", "--snakefile",
                  "-s", "--executor", "-e", "--rerun-triggers"}


def dvc_snakemake_targets(lock: str | Path = "dvc.lock", existing_only: bool = True) -> list[str]:
    """The Snakemake targets of the DVC stages recorded in ``lock`` (the file arguments of each stage's
    ``snakemake ...`` command), in stage order; ``existing_only``: only those present (a clone that pulled some
    stages). What ``make sync`` marks up to date after ``dvc pull``/``dvc checkout``."""
    import shlex

    import yaml

    path = Path(lock)
    if not path.exists():
        raise XmrError(f"{path} not found: run `dvc repro` (or `dvc pull` in a clone of a reproduced commit) first")
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages", {})
    targets: list[str] = []
    for stage in stages.values():
        words = shlex.split(stage.get("cmd", "") if isinstance(stage.get("cmd"), str) else " ".join(stage["cmd"]))
        if not words or Path(words[0]).name != "snakemake":
            continue
        skip = False
        for w in words[1:]:
            if skip:
                skip = False
            elif w.startswith("-"):
                skip = w in _VALUE_OPTIONS
            elif w not in targets and (not existing_only or Path(w).exists()):
                targets.append(w)
    return targets
