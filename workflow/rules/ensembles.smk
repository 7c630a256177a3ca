# Ensembles: config/ensembles/{dataset}/{name}.yaml averages the members' matrices (xmr.studies.ensembles) into the
# run directory runs/{dataset}/{name}/; rule evaluate then writes results/{dataset}/{name}[_{reranker}].json as for
# a recipe (the run wildcard of train and score excludes the ensembles' names; every protocol; a re-ranker runs on the mean; QB-Norm's bank is the mean of the members' banks).
#
#   snakemake -c2 results/coco/dive_ensemble.json

from xmr.studies.ensembles import MATRICES, ensemble_inputs, ensemble_pattern


rule ensemble:
    input:
        unpack(lambda wc: ensemble_inputs(wc.dataset, wc.ensemble, wc.matrix)),
    output:
        f"runs/{{dataset}}/{{ensemble,{ensemble_pattern()}}}/{{matrix,{'|'.join(MATRICES)}}}.npy",
    log:
        "logs/ensemble/{dataset}_{ensemble}_{matrix}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} ensemble --dataset {wildcards.dataset} --name {wildcards.ensemble} --matrix {wildcards.matrix}"
        " --no-progress > {log} 2>&1"
