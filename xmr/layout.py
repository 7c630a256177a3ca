"""The one owner of the project's paths and target grammar (the Snakemake rules call it; nothing else builds
these paths):

- recipes ``config/recipes/{dataset}/{recipe}.yaml``, method defaults ``config/methods/{method}.yaml``;
- features ``{features.dir}/{dataset}/{backbone}/{split}.h5``;
- runs ``runs/{dataset}/{recipe}/`` (``best.pt``, ``last.pt``, ``config.yaml``, ``test_sims.npy``, ...);
- results ``results/{dataset}/{recipe}[_{reranker}].json`` (the target grammar: :func:`parse_target`,
  :func:`target_name`).

Name lists (methods, re-rankers) are read from the registries, never repeated here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xmr.errors import XmrError

RUNS_ROOT = "runs"
RESULTS_ROOT = "results"


def reranker_names() -> list[str]:
    """Registered re-rankers (the suffixes of the target grammar)."""
    from xmr.rerank import RERANKERS

    return RERANKERS.names()


def method_names() -> list[str]:
    from xmr.methods import METHODS

    return METHODS.names()


def method_config_path(method: str, config_dir: str | Path = "config") -> Path:
    return Path(config_dir) / "methods" / f"{method}.yaml"


def feature_file(features_dir: str | os.PathLike, dataset: str, backbone: str, split: str) -> Path:
    """``{features_dir}/{dataset}/{backbone}/{split}.h5``: shared by every method using that backbone."""
    return Path(features_dir) / dataset / backbone / f"{split}.h5"


def feature_path(cfg: dict, split: str) -> Path:
    """:func:`feature_file` of a resolved run config."""
    return feature_file(cfg["features"]["dir"], cfg["dataset"], cfg["features"]["backbone"], split)


def run_dir(dataset: str, recipe: str, runs_root: str | os.PathLike = RUNS_ROOT) -> Path:
    return Path(runs_root) / dataset / recipe


def target_name(recipe: str, reranker: str | None = None) -> str:
    """The inverse of :func:`parse_target`: ``dvse`` + ``fr`` -> ``dvse_fr``."""
    return f"{recipe}_{reranker}" if reranker else recipe


def result_path(dataset: str, recipe: str, reranker: str | None = None,
                results_root: str | os.PathLike = RESULTS_ROOT) -> Path:
    """``results/{dataset}/{recipe}[_{reranker}].json``."""
    return Path(results_root) / dataset / f"{target_name(recipe, reranker)}.json"


#: printed by the workflow's ``onerror`` handler (workflow/rules/common.smk)
AFTER_FAILURE = ("xmr: the workflow stopped; the failed job's one-line error is in its log above. If Snakemake "
                 "itself was killed (pre-emption, kill -9, lost node), run `snakemake --unlock` once, then the same "
                 "command with --rerun-incomplete: unfinished outputs are redone, training resumes from last.pt and "
                 "extraction from its finished shards (docs/faults.md).")


def validate_workflow_config(config: dict, schema_path: str | Path) -> dict:
    """Validate (and fill defaults of) the workflow config against its schema with xmr's one config validator:
    a bad key is one line naming it and its nearest valid names, not Snakemake's dump of the whole schema."""
    import sys

    from xmr.config import load_yaml, validate

    try:
        return validate(config, load_yaml(schema_path), "config/config.yaml (with --config overrides)")
    except XmrError as e:  # Snakemake would add a traceback to the one line
        print(f"xmr workflow: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def parse_target(dataset: str, target: str, config_dir: str | Path = "config") -> tuple[str, str | None]:
    """``results/{dataset}/{target}.json`` -> (recipe, reranker): ``dvse_fr`` is recipe ``dvse`` + FR unless a
    recipe file is literally called ``dvse_fr``."""
    recipes = Path(config_dir) / "recipes" / dataset
    if (recipes / f"{target}.yaml").exists():
        return target, None
    rerankers = reranker_names()
    for suffix in sorted(rerankers, key=len, reverse=True):  # the longest first: dvse_fr_val is dvse + fr_val
        base = target[:-len(suffix) - 1]
        if target.endswith(f"_{suffix}") and (recipes / f"{base}.yaml").exists():
            return base, suffix
    known = sorted(p.stem for p in recipes.glob("*.yaml"))
    raise XmrError(f"no recipe for results/{dataset}/{target}.json: expected {recipes / (target + '.yaml')} "
                   f"(recipes for {dataset}: {', '.join(known) or 'none'}; re-ranker suffixes: {', '.join(rerankers)})")


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
    return [str(feature_file(info["dir"], dataset, info["backbone"], s)) for s in splits]


def recipe_image_inputs(dataset: str, recipe: str, splits: list[str] | str,
                        config_dir: str | Path = "config") -> list[str]:
    """:func:`image_inputs` of a recipe; ``splits``: split names, or ``train`` (train + val: training reads both)
    or ``score`` (the test split)."""
    info = recipe_features(dataset, recipe, config_dir)
    named = {"train": info["splits"][:2], "score": info["splits"][2:]}
    return image_inputs(dataset, info, named.get(splits, [splits]) if isinstance(splits, str) else splits)


#: job kind -> the kind its evaluation-split jobs use (val/test are ~5,000 images, COCO's train 113,287)
EVAL_KINDS = {"extract": "extract_eval"}


def job_resource(resources: dict, kind: str, key: str, dataset: str = "", split: str = "") -> Any:
    """Resource ``key`` of a ``kind`` job from config ``resources``: the dataset's own entry, else ``default``.
    Jobs on a split other than ``train`` use ``{kind}_eval`` when there is one (the dataset's ``{kind}_eval``,
    then its ``{kind}``, then ``default.{kind}_eval``, then ``default.{kind}``)."""
    per_dataset = resources.get(dataset, {}) or {}
    default = resources["default"]
    kinds = [kind]
    if split and split != "train" and kind in EVAL_KINDS:
        kinds = [EVAL_KINDS[kind], kind]
    for table in (per_dataset, default):
        for k in kinds:
            if key in (table.get(k) or {}):
                return table[k][key]
    raise XmrError(f"config/config.yaml: resources.default.{kind}.{key} is not set")


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


def recipe_text_feature_files(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict[str, list[str]]:
    """Precomputed text-feature files a recipe needs, for Snakemake: ``train`` (train + val split files) and
    ``score`` (test split file); empty lists when the recipe uses no precomputed text features."""
    from xmr.config import load_run_config
    from xmr.models.text_precomputed import with_text_features_dir

    cfg = load_run_config(recipe_path(dataset, recipe, config_dir))
    if cfg["text"].get("encoder") != "precomputed":
        return {"train": [], "score": []}
    where = with_text_features_dir(cfg)["features_dir"]
    ds = cfg["dataset_cfg"]
    return {"train": [f"{where}/train.h5", f"{where}/{ds['val_split']}.h5"],
            "score": [f"{where}/{ds['test_split']}.h5"]}


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
