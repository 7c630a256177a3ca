import sys
from functools import lru_cache

from snakemake.utils import min_version

from xmr.planning.doctor import workflow_preflight
from xmr.run.tracking import warn_cluster_sqlite
from xmr.planning.jobs import extract_workers, job_resource, train_job
from xmr.run.layout import RunKey, recipe_path, result_pattern, run_pattern
from xmr.planning.workflow_inputs import (after_failure, checkpoint_inputs, checkpoint_recipe_pattern,
                                          feature_dirs_pattern, precomputed_backbone_pattern, precomputed_import,
                                          parse_result, requested_target_error, rerank_inputs, rerank_options,
                                          run_config, run_inputs, run_split_inputs, stop_on_xmr_error,
                                          validate_workflow_config)

min_version("9.0")


configfile: "config/config.yaml"


validate_workflow_config(config, workflow.source_path("../schemas/config.schema.yaml"))

# a typo'd target on the command line: xmr's one line, not an InputFunctionException from the DAG (the DAG's
# settings are not filled in yet while the Snakefile is read, so the targets come from the command line itself)
if getattr(workflow, "is_main_process", True):
    _target_error = requested_target_error(a for a in sys.argv[1:] if a.startswith("results/"))
    if _target_error:
        print(f"snakemake: {_target_error}", file=sys.stderr)
        sys.exit(1)

onstart:
    # cluster submission with the default SQLite store: say so before the jobs pile up on one file
    warn_cluster_sqlite(workflow.non_local_exec)


onerror:
    # each failed job's error line from its log (Snakemake names only the log file), then what to do after a kill
    print(after_failure(workflow), file=sys.stderr)


# The same interpreter that runs Snakemake runs xmr (works with a venv, conda env or module).
XMR = f'"{sys.executable}" -m xmr'


wildcard_constraints:
    dataset="[a-z0-9]+",
    split="[a-z]+",
    recipe="[a-z0-9_]+",
    target="[a-z0-9_]+",
    # one run key for every kind of run (xmr.run.layout.RunKey): {recipe}, exp/{experiment}/{variant},
    # bench/{bench}/{variant}/s{seed}; results files likewise (xmr.planning.workflow_inputs.parse_result)
    run=run_pattern(),
    result=result_pattern(),
    # the feature folders the recipes name (features.dir; default features/)
    fdir=feature_dirs_pattern(),


def res(kind, key):
    """Resource `key` of job kind `kind` (xmr.planning.jobs.job_resource: per dataset, per split for extraction)."""

    def f(wildcards):
        return job_resource(config["resources"], kind, key, wildcards.get("dataset", ""), wildcards.get("split", ""))

    return f


def run_key(wc):
    return RunKey.parse_run(wc.dataset, wc.run)


@lru_cache(maxsize=None)
@stop_on_xmr_error  # a recipe's bad key: xmr's one line, whichever rule's input function asks first
def config_of(key):
    # one resolution per run while Snakemake plans (its input functions ask for each run many times)
    return run_config(key)


def inputs_of(stage):
    """The input files of a run's `stage` job (xmr.planning.workflow_inputs: run_inputs, or run_split_inputs for a
    split)."""

    def f(wc):
        key = run_key(wc)
        files = run_inputs(key, stage, cfg=config_of(key)) if stage in ("train", "score") else \
            run_split_inputs(key, wc.split, cfg=config_of(key))
        return files if stage == "train" else {"ckpt": str(key.run_dir() / "best.pt"), **files}

    return f


def train_res(key):
    """Item `key` of the training job (xmr.planning.jobs.train_job): DDP launch and resources, the same for every run
    kind; a run's own train.threads (the benchmark's one-thread trainings) sets its cores."""

    def f(wc):
        threads = config_of(run_key(wc))["train"]["threads"]
        return train_job(config["resources"], wc.dataset, threads)[key]

    return f


@stop_on_xmr_error
def result_key(wc):
    # preflight (`xmr doctor`): a real dataset's target reports what is missing when it is first planned
    if "/" not in wc.result:
        workflow_preflight(workflow, wc.dataset, wc.result)
    return parse_result(wc.dataset, wc.result)
