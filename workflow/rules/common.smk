import sys

from snakemake.utils import min_version

from xmr.doctor import workflow_preflight
from xmr.tracking import warn_cluster_sqlite
from xmr.layout import (AFTER_FAILURE, checkpoint_inputs, checkpoint_recipe_pattern, job_resource, parse_target, recipe_features, recipe_image_inputs,
                        recipe_path, recipe_text_feature_files, rerank_inputs, rerank_options, run_dir,
                        validate_workflow_config)

min_version("9.0")


configfile: "config/config.yaml"


validate_workflow_config(config, workflow.source_path("../schemas/config.schema.yaml"))

onstart:
    # cluster submission with the default SQLite store: say so before the jobs pile up on one file
    warn_cluster_sqlite(workflow.non_local_exec)


onerror:
    print(AFTER_FAILURE, file=sys.stderr)


# The same interpreter that runs Snakemake runs xmr (works with a venv, conda env or module).
XMR = f'"{sys.executable}" -m xmr'


wildcard_constraints:
    dataset="[a-z0-9]+",
    split="[a-z]+",
    recipe="[a-z0-9_]+",
    target="[a-z0-9_]+",


def res(kind, key):
    """Resource `key` of job kind `kind` (xmr.layout.job_resource: per dataset, per split for extraction)."""

    def f(wildcards):
        return job_resource(config["resources"], kind, key, wildcards.get("dataset", ""), wildcards.get("split", ""))

    return f


def target_recipe(wc):
    # preflight (`xmr doctor`): a real dataset's target reports what is missing when it is first planned
    workflow_preflight(workflow, wc.dataset, wc.target)
    return parse_target(wc.dataset, wc.target)[0]


def target_reranker(wc):
    return parse_target(wc.dataset, wc.target)[1]


def train_inputs(wc):
    # image side: features/*.h5, or the dataset's annotations for end-to-end recipes (features.source: images)
    return {"config": recipe_path(wc.dataset, wc.recipe),
            "images": recipe_image_inputs(wc.dataset, wc.recipe, "train"),
            "text_features": recipe_text_feature_files(wc.dataset, wc.recipe)["train"]}


def score_inputs(wc):
    return {"ckpt": str(run_dir(wc.dataset, wc.recipe) / "best.pt"),
            "images": recipe_image_inputs(wc.dataset, wc.recipe, "score"),
            "text_features": recipe_text_feature_files(wc.dataset, wc.recipe)["score"]}
