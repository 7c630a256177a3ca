# Visual features, one HDF5 file per dataset x backbone x split, shared by every method using that backbone.


def dataset_annotations(wc):
    from xmr.config import load_dataset_config

    ds = load_dataset_config(wc.dataset)
    return ds.get("annotations", [])


rule extract:
    input:
        dataset_annotations,
    output:
        "features/{dataset}/{backbone}/{split}.h5",
    log:
        "logs/extract/{dataset}_{backbone}_{split}.log",
    threads: res("extract", "cpus_per_task")
    resources:
        gpu=res("extract", "gpu"),
        mem_mb=res("extract", "mem_mb"),
        runtime=res("extract", "runtime"),
        cpus_per_task=res("extract", "cpus_per_task"),
    shell:
        "{XMR} extract --dataset {wildcards.dataset} --backbone {wildcards.backbone} --split {wildcards.split}"
        " --out {output} --workers {threads} --no-progress > {log} 2>&1"
