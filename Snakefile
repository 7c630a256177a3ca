# xmr workflow entry point: data -> features -> train -> score -> evaluate (+ re-ranking).
# Every rule calls one `xmr` subcommand; see workflow/rules/*.smk.
include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/text_features.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/ensembles.smk"
include: "workflow/rules/experiments.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/figures.smk"
include: "workflow/rules/zoo.smk"


rule all:
    default_target: True
    input:
        expand("results/{dataset}/{target}.json", dataset=config["default"]["dataset"],
               target=config["default"]["targets"]),
