# Evaluation: results/{dataset}/{recipe}.json (plain) and results/{dataset}/{recipe}_{reranker}.json.


rule evaluate:
    input:
        sims=lambda wc: f"runs/{wc.dataset}/{target_recipe(wc)}/test_sims.npy",
    output:
        "results/{dataset}/{target}.json",
    params:
        run=lambda wc: f"runs/{wc.dataset}/{target_recipe(wc)}",
        rerank=lambda wc: f"--rerank {target_reranker(wc)}" if target_reranker(wc) else "",
    log:
        "logs/evaluate/{dataset}_{target}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} {params.rerank} --out {output} > {log} 2>&1"


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
