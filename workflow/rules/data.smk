# Datasets. Real datasets (COCO, Flickr30K, CUB) are user-provided under data/ (README "Datasets");
# the embedded synthetic one is generated.


rule synth:
    output:
        "data/synth/dataset_synth.json",
    log:
        "logs/synth.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} synth --dataset synth --out data/synth > {log} 2>&1"
