# Evaluation: results/{dataset}/{recipe}.json (plain) and results/{dataset}/{recipe}_{reranker}.json.


def target_run(wc):
    return str(run_dir(wc.dataset, target_recipe(wc)))


rule evaluate:
    input:
        unpack(lambda wc: {"sims": f"{target_run(wc)}/test_sims.npy",
                           **rerank_inputs(target_run(wc), target_reranker(wc))}),
    output:
        json="results/{dataset}/{target}.json",
        metrics="results/{dataset}/{target}.metrics.json",  # compact: what `dvc metrics show` prints
    params:
        run=target_run,
        rerank=lambda wc: rerank_options(target_run(wc), target_reranker(wc)),
    log:
        "logs/evaluate/{dataset}_{target}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} {params.rerank} --out {output.json}"
        " --metrics-out {output.metrics} > {log} 2>&1"


rule summary:
    input:
        lambda wc: expand("results/{dataset}/{target}.json", dataset=wc.dataset,
                          target=config["summary_targets"].get(wc.dataset, config["default"]["targets"])),
    output:
        json="results/{dataset}/summary.json",
        md="results/{dataset}/summary.md",
        csv="results/{dataset}/summary.csv",
    log:
        "logs/summary/{dataset}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} summarize {input} --out-dir results/{wildcards.dataset} > {log} 2>&1"


rule score_bank:
    # QB-Norm's query bank (config `qbnorm_bank`): bank queries from a non-test split against the test gallery
    input:
        ckpt="runs/{dataset}/{recipe}/best.pt",
        images=lambda wc: recipe_image_inputs(wc.dataset, wc.recipe, ["train", recipe_features(wc.dataset, wc.recipe)["splits"][2]]),
    output:
        i2t="runs/{dataset}/{recipe}/qbnorm_bank_i2t.npy",
        t2i="runs/{dataset}/{recipe}/qbnorm_bank_t2i.npy",
    params:
        split=config["qbnorm_bank"]["split"],
        max_images=config["qbnorm_bank"]["max_images"],
    log:
        "logs/score/{dataset}_{recipe}_qbnorm_bank.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score-bank --run runs/{wildcards.dataset}/{wildcards.recipe} --split {params.split}"
        " --max-images {params.max_images} --out-i2t {output.i2t} --out-t2i {output.t2i} --no-progress > {log} 2>&1"
