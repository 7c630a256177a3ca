# The model zoo page: every recipe with a checkpoint: section (a released model, imported instead of trained), with
# xmr's numbers beside the paper's where results/{dataset}/{name}[_fr].json exist (docs/model_zoo.md).
#
#   snakemake -c1 docs/model_zoo.md

from xmr.studies.zoo import zoo_page_inputs


rule model_zoo:
    input:
        lambda wc: zoo_page_inputs(),
    output:
        "docs/model_zoo.md",
    log:
        "logs/report/model_zoo.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} model-zoo --out {output} > {log} 2>&1"
