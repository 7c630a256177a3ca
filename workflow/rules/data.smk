# Datasets. Real datasets (COCO, Flickr30K, CUB) are user-provided under data/ (README "Datasets");
# the embedded synthetic one is generated.


rule synth:
    output:
        "data/synth/dataset_synth.json",
    log:
        "logs/synth.log",
    threads: res("synth", "cpus_per_task")
    resources:
        mem_mb=res("synth", "mem_mb"),
        runtime=res("synth", "runtime"),
        cpus_per_task=res("synth", "cpus_per_task"),
    shell:
        "{XMR} synth --dataset synth --out data/synth --workers {threads} > {log} 2>&1"


# Real datasets cannot be downloaded by the pipeline: this rule symlinks the user's copy (`source:` in
# config/datasets/{dataset}.yaml, laid out like data/{dataset}/) and fails with what to do when there is none.
# Being a rule, it lets `snakemake -n results/coco/dvse_fr.json` plan the whole chain on a fresh clone.
from xmr.data.link import link_rule_constraints


rule link_dataset:
    output:
        "data/{dataset}/{annotations}",
    wildcard_constraints:
        **link_rule_constraints(),
    log:
        "logs/link_dataset/{dataset}/{annotations}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} link-dataset --dataset {wildcards.dataset} > {log} 2>&1"
