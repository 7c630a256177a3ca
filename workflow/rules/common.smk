import sys

from snakemake.utils import min_version

from xmr.models.text_precomputed import recipe_text_feature_files
from xmr.workflow import (AFTER_FAILURE, parse_target, recipe_features, recipe_image_inputs, recipe_path,
                          rerank_inputs, rerank_options, validate_workflow_config)

min_version("9.0")


configfile: "config/config.yaml"


validate_workflow_config(config, workflow.source_path("../schemas/config.schema.yaml"))

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
    """Resource `key` of job kind `kind`: the dataset's own entry in config `resources`, else `default`."""

    def f(wildcards):
        per_dataset = config["resources"].get(wildcards.get("dataset", ""), {}).get(kind, {})
        return per_dataset.get(key, config["resources"]["default"][kind][key])

    return f


def target_recipe(wc):
    return parse_target(wc.dataset, wc.target)[0]


def target_reranker(wc):
    return parse_target(wc.dataset, wc.target)[1]


def train_inputs(wc):
    # image side: features/*.h5, or the dataset's annotations for end-to-end recipes (features.source: images)
    return {"config": recipe_path(wc.dataset, wc.recipe),
            "images": recipe_image_inputs(wc.dataset, wc.recipe, "train"),
            "text_features": recipe_text_feature_files(wc.dataset, wc.recipe)["train"]}


def score_inputs(wc):
    return {"ckpt": f"runs/{wc.dataset}/{wc.recipe}/best.pt",
            "images": recipe_image_inputs(wc.dataset, wc.recipe, "score"),
            "text_features": recipe_text_feature_files(wc.dataset, wc.recipe)["score"]}
