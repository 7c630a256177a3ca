"""What the workflow's rules read, per run key (:class:`xmr.run.layout.RunKey`): a run's resolved config and the files
it is read from, the image and text feature files its training and scoring need (honouring ``features.dir``,
``features.source: images`` and precomputed text features for every run kind alike), a re-ranker's extra input
files (declared on its :class:`~xmr.rerank.base.RerankerSpec`), the workflow config's validation, the
training-count announcement of big targets, and what the workflow prints when a config is wrong or a job fails.
The rules in ``workflow/rules/*.smk`` only call these."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from xmr.core.errors import XmrError
from xmr.run.layout import PLAIN, RUNS_ROOT, RunKey, feature_file, parse_target, recipe_path

#: printed by the workflow's ``onerror`` handler (workflow/rules/common.smk, :func:`after_failure`)
AFTER_FAILURE = ("xmr: the workflow stopped; each failed job's one-line error is above, from its log. If Snakemake "
                 "itself was killed (pre-emption, kill -9, lost node), run `snakemake --unlock` once, then the same "
                 "command with --rerun-incomplete: unfinished outputs are redone, training resumes from last.pt and "
                 "extraction from its finished shards (docs/faults.md).")
#: the one line an ``xmr`` command ends with when it fails (xmr.cli.main)
XMR_ERROR_LINE = re.compile(r"xmr [\w-]+: (error: |interrupted)")
#: how much of the end of a job's log is read for its error line (a training's log grows with its epochs)
LOG_TAIL_BYTES = 1 << 16


def job_error_line(log: str | os.PathLike) -> str | None:
    """What a failed job's log says about its end: its last ``xmr COMMAND: error: ...`` line, else (a crash, a
    shell's message, a killed process) ``its last line: ...``; None when there is no such log or it is empty."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return None
    error = next((ln for ln in reversed(lines) if XMR_ERROR_LINE.match(ln)), None)
    return error or (f"its last line: {lines[-1]}" if lines else None)


def after_failure(workflow: Any) -> str:
    """What the workflow's ``onerror`` handler prints: ``rule NAME (LOG): LINE`` for each failed job
    (:func:`job_error_line`; Snakemake itself names only the job's log file, and the rules send an ``xmr``
    command's output there), then :data:`AFTER_FAILURE`. ``workflow``: Snakemake's, whose scheduler holds the jobs
    that failed. A job's logs are its ``log:`` files and its ``log`` parameter (the training's log, which its
    command appends to: Snakemake would delete a ``log:`` before each run)."""
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None) or ()
    lines = []
    for job in sorted((j for group in failed for j in getattr(group, "jobs", None) or [group]), key=str):
        params = getattr(job, "params", None)
        for log in [*job.log, *([params.log] if getattr(params, "log", None) else [])]:
            error = job_error_line(log)
            if error:
                lines.append(f"rule {job.rule.name} ({log}): {error}")
    return "\n".join([*lines, AFTER_FAILURE])


def validate_workflow_config(config: dict, schema_path: str | Path) -> dict:
    """Validate (and fill defaults of) the workflow config against its schema with xmr's one config validator:
    a bad key is one line naming it and its nearest valid names, not Snakemake's dump of the whole schema."""
    from xmr.config.loader import load_yaml, validate
    from xmr.planning.jobs import check_resources

    src = "config/config.yaml (with --config overrides)"
    try:
        validate(config, load_yaml(schema_path), src)
        check_resources(config["resources"], src)
        return config
    except XmrError as e:  # Snakemake would add a traceback to the one line
        print(f"xmr workflow: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def stop_on_xmr_error(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (what the rules' input functions resolve through: a run's config, a results target's run key)
    stopping Snakemake with xmr's one line for an :class:`XmrError` (a misspelt recipe key, an experiment without
    that variant), as the ``xmr`` commands print it, and exit status 1. Raised as it is, the error would reach the
    user inside an InputFunctionException of whichever rule asked first, with a traceback; SystemExit passes
    through Snakemake's handling of input-function errors."""

    @functools.wraps(func)
    def stopping(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except XmrError as e:
            print(f"xmr workflow: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    return stopping


# --- a run's config ---------------------------------------------------------------------------------------------

def _experiment(name: str, dataset: str, config_dir: str | Path):
    from xmr.studies.experiments import experiment_path, load_experiment

    exp = load_experiment(experiment_path(name, config_dir))
    exp.check_dataset(dataset)
    return exp


def _benchmark(key: RunKey, config_dir: str | Path):
    from xmr.studies.benchmark import benchmark_path, load_benchmark

    bench = load_benchmark(benchmark_path(key.name, config_dir))
    if bench.dataset != key.dataset:
        raise XmrError(f"{bench.path}: benchmark {key.name} is for dataset {bench.dataset}, not {key.dataset}")
    bench.check_variant(key.variant)
    return bench


def run_config_files(key: RunKey, config_dir: str | Path = "config") -> list[str]:
    """The files a run's config is read from (the recipe; the experiment or benchmark file): its training's
    config inputs."""
    if key.kind == "experiment":
        exp = _experiment(key.name, key.dataset, config_dir)
        return [recipe_path(key.dataset, exp.recipe_of(key.variant), config_dir), str(exp.path)]
    if key.kind == "benchmark":
        bench = _benchmark(key, config_dir)
        return [str(bench.recipe_path(key.variant)), str(bench.path)]
    return [recipe_path(key.dataset, key.name, config_dir)]


def run_config(key: RunKey, extra: Iterable[str] = (), config_dir: str | Path = "config") -> dict:
    """The run's validated config: its recipe with the experiment's or benchmark's overrides, then ``extra``
    ``KEY.PATH=VALUE`` strings (``xmr train --set``)."""
    from xmr.run.config import load_run_config

    if key.kind == "experiment":
        from xmr.studies.experiments import resolve_variant

        return resolve_variant(_experiment(key.name, key.dataset, config_dir), key.variant, key.dataset, extra=list(extra))
    if key.kind == "benchmark":
        bench = _benchmark(key, config_dir)
        return load_run_config(bench.recipe_path(key.variant), bench.train_overrides(key.variant, key.seed),
                               user_set=extra)
    path = recipe_path(key.dataset, key.name, config_dir)
    if not Path(path).exists():
        parse_target(key.dataset, key.name, config_dir)  # the one-line error listing the dataset's recipes
    return load_run_config(path, user_set=extra)


def parse_result(dataset: str, result: str, config_dir: str | Path = "config") -> tuple[RunKey, list[str]]:
    """``results/{dataset}/{result}.json`` -> (run key, the re-rankers the file holds; ``none`` = plain). The
    inverse of :meth:`RunKey.result_path`."""
    parts = result.split("/")
    if len(parts) == 1:
        recipe, reranker = parse_target(dataset, result, config_dir)
        return RunKey.recipe(dataset, recipe), [reranker or PLAIN]
    if len(parts) == 3 and parts[0] == "exp":
        exp = _experiment(parts[1], dataset, config_dir)
        variant, reranker = exp.parse_target(parts[2])
        return exp.run_key(dataset, variant), [reranker or PLAIN]  # a benchmark's run when it is the same run
    if len(parts) == 4 and parts[0] == "bench" and parts[3][:1] == "s" and parts[3][1:].isdigit():
        key = RunKey.benchmark(dataset, parts[1], parts[2], int(parts[3][1:]))
        return key, list(_benchmark(key, config_dir).rerank)
    raise XmrError(f"results/{dataset}/{result}.json: not a results target ({{recipe}}[_{{reranker}}], "
                   f"exp/{{experiment}}/{{variant}}[_{{reranker}}] or bench/{{benchmark}}/{{variant}}/s{{seed}})")



def requested_target_error(targets: Iterable[str], config_dir: str | Path = "config") -> str | None:
    """xmr's one line for the first results target asked for on the command line that names no recipe,
    experiment variant or benchmark run (a typo: ``results/synth/vsep.json``), or whose dataset config does not
    load (``config/datasets/{dataset}.yaml``: a bad key, files outside a ``source:`` root), checked when the
    Snakefile is read, before Snakemake's DAG would wrap the same error in a dozen lines of
    InputFunctionException. A broken dataset config stops its own targets only."""
    import re

    from xmr.config.loader import load_dataset_config
    from xmr.run.layout import result_pattern, split_results_target

    pattern = re.compile(result_pattern(config_dir=config_dir))
    for target in targets:
        parts = split_results_target(target)
        if not parts or not pattern.fullmatch(parts[1]):
            continue
        try:
            parse_result(*parts, config_dir)
            load_dataset_config(parts[0], config_dir)
        except XmrError as e:
            return str(e)
    return None

# --- the files a run reads ----------------------------------------------------------------------------------------

def features_info(cfg: dict) -> dict:
    """What a run's image side needs: backbone key, feature dir, image source and the dataset's splits."""
    ds = cfg["dataset_cfg"]
    return {"dataset": cfg["dataset"], "backbone": cfg["features"]["backbone"], "dir": cfg["features"]["dir"],
            "source": cfg["features"]["source"], "splits": ["train", ds["val_split"], ds["test_split"]],
            "annotations": ds.get("annotations")}


def image_inputs(dataset: str, info: dict, splits: list[str]) -> list[str]:
    """The files the image side of ``splits`` is read from, for a :func:`features_info` ``info`` (``xmr doctor``;
    a run's own inputs come from :func:`split_inputs`, which agrees with this): the feature
    files ``{dir}/{dataset}/{backbone}/{split}.h5``, or, end to end (``features.source: images``), the dataset's
    annotation file(s) (the image files are checked when training starts, as ``xmr extract`` does)."""
    if info.get("source") == "images":
        ann = info.get("annotations") or []
        return [ann] if isinstance(ann, str) else list(ann)
    return [str(feature_file(info["dir"], dataset, info["backbone"], s)) for s in splits]


def stage_splits(info: dict, stage: str | list[str]) -> list[str]:
    """``train`` (train + val: training reads both), ``score`` (the test split), a split name, or a list."""
    named = {"train": info["splits"][:2], "score": info["splits"][2:]}
    return named.get(stage, [stage]) if isinstance(stage, str) else list(stage)


def split_inputs(cfg: dict, splits: list[str]) -> dict[str, list[str]]:
    """The image side and the precomputed text features of ``splits`` (:class:`xmr.run.inputs.RunInputs`, the
    record the trainer's resume digest and the gallery cache use too), each file once."""
    from xmr.run.inputs import RunInputs
    from xmr.settings.run_settings import run_settings

    settings = run_settings(cfg)
    records = [RunInputs.of(settings, s) for s in splits]
    images = [str(p) for r in records for p in r.image_side()]
    return {"images": list(dict.fromkeys(images)),
            "text_features": [str(r.text_features) for r in records if r.text_features is not None]}


def text_feature_files(cfg: dict) -> dict[str, list[str]]:
    """Precomputed text-feature files a run needs: ``train`` (train + val split files) and ``score`` (test split
    file); empty lists when the run uses no precomputed text features."""
    info = features_info(cfg)
    return {stage: split_inputs(cfg, stage_splits(info, stage))["text_features"] for stage in ("train", "score")}


def run_inputs(key: RunKey, stage: str, config_dir: str | Path = "config", cfg: dict | None = None
               ) -> dict[str, list[str]]:
    """The input files of a run's ``train`` or ``score`` job, for every run kind: the config files (training),
    the image side (features or annotations) and the precomputed text features of the splits it reads.
    ``cfg``: the run's resolved config when the caller has it (the workflow resolves each run once)."""
    cfg = cfg or run_config(key, config_dir=config_dir)
    out = split_inputs(cfg, stage_splits(features_info(cfg), stage))
    if stage == "train":
        out["config"] = run_config_files(key, config_dir)
    return out


def run_split_inputs(key: RunKey, split: str, config_dir: str | Path = "config", cfg: dict | None = None
                     ) -> dict[str, list[str]]:
    """The input files of scoring one split of a run (``xmr score --split``): ``val``/``test`` name the dataset's
    validation/test splits, any other name a split itself."""
    cfg = cfg or run_config(key, config_dir=config_dir)
    info = features_info(cfg)
    return split_inputs(cfg, [{"val": info["splits"][1], "test": info["splits"][2]}.get(split, split)])


def recipe_features(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict:
    """:func:`features_info` of a recipe."""
    return features_info(run_config(RunKey.recipe(dataset, recipe), config_dir=config_dir))


def recipe_image_inputs(dataset: str, recipe: str, splits: list[str] | str,
                        config_dir: str | Path = "config") -> list[str]:
    """:func:`image_inputs` of a recipe (``splits`` as :func:`stage_splits` takes them)."""
    cfg = run_config(RunKey.recipe(dataset, recipe), config_dir=config_dir)
    return split_inputs(cfg, stage_splits(features_info(cfg), splits))["images"]


def recipe_text_feature_files(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict[str, list[str]]:
    """:func:`text_feature_files` of a recipe."""
    return text_feature_files(run_config(RunKey.recipe(dataset, recipe), config_dir=config_dir))


def feature_dirs_pattern(config_dir: str | Path = "config") -> str:
    """The ``{fdir}`` wildcard of the feature rules: one of :func:`feature_dirs`."""
    import re

    return "|".join(re.escape(d) for d in feature_dirs(config_dir))


def feature_dirs(config_dir: str | Path = "config") -> list[str]:
    """Every ``features.dir`` the recipes and method files name (plus the schema default ``features``): the
    values the feature rules' ``{fdir}`` wildcard may take. Read without validation (it runs when the workflow
    is parsed)."""
    from xmr.config.loader import load_yaml

    dirs = {"features"}
    root = Path(config_dir)
    for p in sorted([*root.glob("recipes/*/*.yaml"), *root.glob("methods/*.yaml")]):
        value = (load_yaml(p).get("features") or {}).get("dir")
        if isinstance(value, str) and value:
            dirs.add(value.rstrip("/"))
    return sorted(dirs)


# --- re-rankers' extra inputs ----------------------------------------------------------------------------------

def rerank_inputs(run_dir: str | os.PathLike, reranker: str | None) -> dict[str, str]:
    """Files a re-ranker reads besides the similarity matrix, as ``{parameter: path}``: the run-directory files its
    :class:`~xmr.rerank.base.RerankerSpec` declares in ``run_inputs`` (QB-Norm's query bank); none for most."""
    if not reranker or reranker == PLAIN:
        return {}
    from xmr.rerank import RERANKERS

    return {param: f"{run_dir}/{name}" for param, name in RERANKERS.get(reranker).run_inputs.items()}


def rerank_options(run_dir: str | os.PathLike, rerankers: str | list[str] | None) -> str:
    """The ``xmr test`` options selecting ``rerankers`` (one name, or a list: one file holding each; empty for
    plain evaluation alone)."""
    names = [rerankers] if isinstance(rerankers, str) or rerankers is None else list(rerankers)
    names = [n for n in names if n]
    if names in ([], [PLAIN]):
        return ""
    files = {k: v for n in names for k, v in rerank_inputs(run_dir, n).items()}
    if files and len(names) > 1:
        raise XmrError(f"re-rankers {', '.join(names)}: one of them reads extra files ({', '.join(files)}); "
                       f"evaluate it in a results file of its own")
    extra = " --rerank-param " + " ".join(f"{k}={v}" for k, v in files.items()) if files else ""
    if len(names) == 1:
        return f"--rerank {names[0]}{extra}"
    return f"--reranks {' '.join(names)}{extra}"


# --- big targets say they are big ----------------------------------------------------------------------------

_ANNOUNCED: set[str] = set()


def planned_runs(dataset: str, recipes: list[str], experiments: list = (),
                 runs_root: str | os.PathLike = RUNS_ROOT) -> list[Path]:
    """The run directories (one training each) behind ``recipes`` of ``dataset`` plus the variants of
    ``experiments`` (:class:`xmr.studies.experiments.Experiment`; a comparison of recipes trains the recipes
    themselves)."""
    from xmr.studies.ensembles import is_ensemble, load_ensemble

    def trained(name: str) -> list[str]:  # an ensemble trains its members, not itself
        return list(load_ensemble(dataset, name).members) if is_ensemble(dataset, name) else [name]

    runs = {RunKey.recipe(dataset, m).run_dir(runs_root) for r in recipes for m in trained(r)}
    for exp in experiments:
        if dataset in exp.datasets:
            if exp.recipe:
                runs.update(exp.run_dir(dataset, v, runs_root) for v in exp.variants_for(dataset))
            else:
                runs.update(RunKey.recipe(dataset, m).run_dir(runs_root) for v in exp.variants_for(dataset)
                            for m in trained(v))
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
    print(training_count_message(target, run_dirs), file=sys.stderr, flush=True)


# --- imported checkpoints ---------------------------------------------------------------------------------------

def checkpoint_recipes(config_dir: str | Path = "config") -> list[str]:
    """Names of the recipes (any dataset) with a ``checkpoint:`` section: their runs are imported from a published
    checkpoint (rule ``import_checkpoint``), not trained. The section must be in the recipe file itself."""
    from xmr.config.loader import load_yaml

    return sorted({p.stem for p in Path(config_dir).glob("recipes/*/*.yaml") if "checkpoint" in load_yaml(p)})


def checkpoint_recipe_pattern(config_dir: str | Path = "config") -> str:
    """The ``recipe`` wildcard of rule ``import_checkpoint``: exactly :func:`checkpoint_recipes` (none: nothing)."""
    import re

    names = checkpoint_recipes(config_dir)
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def checkpoint_inputs(dataset: str, recipe: str, config_dir: str | Path = "config") -> dict[str, str]:
    """Files rule ``import_checkpoint`` reads: the recipe, and the official file and its vocabulary file when they
    are there (then a new download re-imports). A missing one is no input, so that the target is still planned
    (no training rule takes over) and the job, like ``xmr doctor``, names the file and where it is published."""
    from xmr.config.loader import load_yaml

    path = recipe_path(dataset, recipe, config_dir)
    spec = load_yaml(path).get("checkpoint") if Path(path).exists() else None
    if not spec:
        raise XmrError(f"{path}: no checkpoint: section, but a recipe {recipe!r} of another dataset has one; "
                       f"give the imported recipe its own name")
    out = {"config": path}
    for key in ("src", "vocab"):
        if spec.get(key) and Path(spec[key]).is_file():  # a tokenizer folder is no Snakemake input either
            out[key] = str(spec[key])
    return out


# --- features the authors precomputed (config/backbones.yaml name: precomputed) ---------------------------------

def precomputed_backbones(config_dir: str | Path = "config") -> list[str]:
    """Keys of config/backbones.yaml whose features only ``xmr import-features`` can make (no extractor)."""
    from xmr.config.loader import load_yaml

    return sorted(k for k, v in (load_yaml(Path(config_dir) / "backbones.yaml") or {}).items()
                  if isinstance(v, dict) and v.get("name") == "precomputed")


def precomputed_backbone_pattern(config_dir: str | Path = "config") -> str:
    """The ``backbone`` wildcard of rule ``import_precomputed``: exactly :func:`precomputed_backbones`."""
    import re

    names = precomputed_backbones(config_dir)
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def precomputed_import(dataset: str, backbone: str, split: str, out: str | None = None,
                       config_dir: str | Path = "config") -> tuple[dict[str, list[str]], str]:
    """Rule ``import_precomputed``: its inputs (the dataset's annotations, and the source split's ``_ims.npy`` when
    it is there) and the entry's ``import_command`` as ``xmr`` arguments (writing ``out`` when given). A missing
    source is no input, so that the target is still planned (``extract`` cannot make these features) and the job,
    running the documented command, names the missing file."""
    import shlex

    from xmr.config.loader import load_backbone_config, load_dataset_config
    from xmr.features.backbones.precomputed import import_argv, import_source
    from xmr.features.importers import scan_source_split

    bb = load_backbone_config(backbone, config_dir)
    ds = load_dataset_config(dataset, config_dir)
    annotations = ds.get("annotations") or []
    inputs = {"annotations": [annotations] if isinstance(annotations, str) else list(annotations)}
    src = import_source(bb, dataset, split)
    if src:
        ims = Path(src) / f"{scan_source_split(ds, split)}_ims.npy"
        if ims.is_file():
            inputs["ims"] = [str(ims)]
    return inputs, shlex.join(import_argv(bb, dataset, split, out))
