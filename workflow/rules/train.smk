# Training (one run directory per dataset x recipe) and the test-split similarity matrix.


rule train:
    input:
        unpack(train_inputs),
    output:
        ckpt="runs/{dataset}/{recipe}/best.pt",
        summary="runs/{dataset}/{recipe}/train.json",
    log:
        "logs/train/{dataset}_{recipe}.log",
    threads: config["resources"]["train"]["cpus_per_task"]
    resources:
        gpu=res("train", "gpu"),
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        cpus_per_task=res("train", "cpus_per_task"),
    shell:
        "{XMR} train --config {input.config} --out-dir runs/{wildcards.dataset}/{wildcards.recipe}"
        " --no-progress > {log} 2>&1"


rule score:
    input:
        unpack(score_inputs),
    output:
        "runs/{dataset}/{recipe}/test_sims.npy",
    log:
        "logs/score/{dataset}_{recipe}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/{wildcards.recipe} --out {output} --no-progress > {log} 2>&1"
