# Visual features, one HDF5 file per dataset x backbone x split, shared by every method using that backbone, in
# the folder the run's features.dir names ({fdir}; default features/).


def dataset_annotations(wc):
    from xmr.config.loader import load_dataset_config

    ds = load_dataset_config(wc.dataset)
    return ds.get("annotations", [])


rule extract:
    input:
        dataset_annotations,
    output:
        "{fdir}/{dataset}/{backbone}/{split}.h5",
    log:
        "logs/extract/{fdir}/{dataset}_{backbone}_{split}.log",
    threads: res("extract", "cpus_per_task")
    priority: res("extract", "priority")
    resources:
        gpu=res("extract", "gpu"),
        mem_mb=res("extract", "mem_mb"),
        runtime=res("extract", "runtime"),
        cpus_per_task=res("extract", "cpus_per_task"),
    params:
        workers=lambda wc, threads: extract_workers(threads),
    shell:
        "{XMR} extract --dataset {wildcards.dataset} --backbone {wildcards.backbone} --split {wildcards.split}"
        " --out {output} --workers {params.workers} --threads {threads} --no-progress > {log} 2>&1"


# The SCAN/VSE∞ precomputed download *is* the BUTD R101 fixed-36 feature set: when data/{dataset}/precomp/
# holds it, import it (in the dataset's Karpathy order) instead of extracting with detectron2. Without that
# folder Snakemake falls back to `extract`. Other imports (BUTD TSV): `xmr import-features`, docs/datasets.md.
def scan_precomp_inputs(wc):
    from xmr.config.loader import load_dataset_config
    from xmr.features.importers import scan_source_split

    ds = load_dataset_config(wc.dataset)
    src = scan_source_split(ds, wc.split)
    return {"ims": f"data/{wc.dataset}/precomp/{src}_ims.npy", "caps": f"data/{wc.dataset}/precomp/{src}_caps.txt",
            "annotations": ds.get("annotations", [])}


ruleorder: import_scan > extract


rule import_scan:
    input:
        unpack(scan_precomp_inputs),
    output:
        "{fdir}/{dataset}/butd_r101_k36/{split}.h5",
    log:
        "logs/import/{fdir}/{dataset}_butd_r101_k36_{split}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("extract", "runtime"),  # per split: val/test use extract_eval
    shell:
        "{XMR} import-features --format scan --src data/{wildcards.dataset}/precomp --dataset {wildcards.dataset}"
        " --split {wildcards.split} --out {output} --no-progress > {log} 2>&1"


# Features the authors precomputed and released (config/backbones.yaml `name: precomputed`, e.g. VSE++'s VGG19
# `*_precomp` vectors): nothing can extract them, so they are always made by the entry's `import_command`
# (`xmr import-features`), never planned as `extract`.
ruleorder: import_precomputed > extract


rule import_precomputed:
    input:
        unpack(lambda wc: precomputed_import(wc.dataset, wc.backbone, wc.split)[0]),
    output:
        f"{{fdir}}/{{dataset}}/{{backbone,{precomputed_backbone_pattern()}}}/{{split}}.h5",
    params:
        args=lambda wc, output: precomputed_import(wc.dataset, wc.backbone, wc.split, output[0])[1],
    log:
        "logs/import/{fdir}/{dataset}_{backbone}_{split}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("extract", "runtime"),
    shell:
        "{XMR} {params.args} --no-progress > {log} 2>&1"
