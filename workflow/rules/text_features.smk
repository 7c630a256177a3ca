# Precomputed caption features (HGLMM Fisher vectors + PCA; settings in config/text_features.yaml):
# the model is fitted once on the training split, then every split is encoded with it.


def text_feature_annotations(wc):
    from xmr.config.loader import load_dataset_config

    return load_dataset_config(wc.dataset).get("annotations", [])


# {fdir}/{dataset}/hglmm/{split}.h5 also matches rule `extract` (backbone=hglmm): this rule wins
ruleorder: text_features > extract


rule text_features_model:
    input:
        text_feature_annotations,
        "config/text_features.yaml",
    output:
        "{fdir}/{dataset}/hglmm/model.npz",
    log:
        "logs/text_features/{fdir}/{dataset}_hglmm_model.log",
    threads: res("extract", "cpus_per_task")
    resources:
        gpu=res("extract", "gpu"),
        mem_mb=res("extract", "mem_mb"),
        runtime=res("extract", "runtime"),
        cpus_per_task=res("extract", "cpus_per_task"),
    shell:
        "{XMR} text-features --dataset {wildcards.dataset} --kind hglmm --fit-split train --refit"
        " --out-dir {wildcards.fdir}/{wildcards.dataset}/hglmm --no-progress > {log} 2>&1"


rule text_features:
    input:
        text_feature_annotations,
        model="{fdir}/{dataset}/hglmm/model.npz",
    output:
        "{fdir}/{dataset}/hglmm/{split}.h5",
    log:
        "logs/text_features/{fdir}/{dataset}_hglmm_{split}.log",
    threads: res("extract", "cpus_per_task")
    resources:
        gpu=res("extract", "gpu"),
        mem_mb=res("extract", "mem_mb"),
        runtime=res("extract", "runtime"),
        cpus_per_task=res("extract", "cpus_per_task"),
    shell:
        "{XMR} text-features --dataset {wildcards.dataset} --kind hglmm --splits {wildcards.split}"
        " --out-dir {wildcards.fdir}/{wildcards.dataset}/hglmm --no-progress > {log} 2>&1"
