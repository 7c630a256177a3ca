# Datasets. Real datasets (COCO, Flickr30K, CUB) are user-provided under data/ (README "Datasets");
# the embedded synthetic one is generated.


rule synth:
    output:
        "data/synth/dataset_synth.json",
    log:
        "logs/synth.log",
    resources:
        mem_mb=2000,
        runtime=30,
    shell:
        "{XMR} synth --dataset synth --out data/synth > {log} 2>&1"
