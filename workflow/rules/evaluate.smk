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
        mem_mb=res("score", "mem_mb"),
        runtime=60,
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} {params.rerank} --out {output} > {log} 2>&1"
