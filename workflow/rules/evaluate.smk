# Evaluation: results/{dataset}/{recipe}.json (plain) and results/{dataset}/{recipe}_{reranker}.json.


def result_run(wc):
    return str(result_key(wc)[0].run_dir())


rule evaluate:
    # results/{dataset}/{result}.json of every run kind: {recipe}[_{reranker}], exp/{experiment}/{variant}[_{reranker}],
    # bench/{bench}/{variant}/s{seed} (one file holding each re-ranker of the benchmark)
    input:
        unpack(lambda wc: {"sims": f"{result_run(wc)}/test_sims.npy",
                           **{k: v for rr in result_key(wc)[1] for k, v in rerank_inputs(result_run(wc), rr).items()}}),
    output:
        json="results/{dataset}/{result}.json",
        metrics="results/{dataset}/{result}.metrics.json",  # compact: what `dvc metrics show` prints
        ranks="results/{dataset}/{result}.ranks.npz",  # per-query ranks: the benchmark's query-level test
    params:
        run=result_run,
        rerank=lambda wc: rerank_options(result_run(wc), result_key(wc)[1]),
    log:
        "logs/evaluate/{dataset}_{result}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} {params.rerank} --out {output.json}"
        " --metrics-out {output.metrics} --ranks-out {output.ranks} > {log} 2>&1"


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
        ckpt="runs/{dataset}/{run}/best.pt",
        images=lambda wc: [f for split in (config["qbnorm_bank"]["split"], "test")
                           for f in run_split_inputs(run_key(wc), split, cfg=config_of(run_key(wc)))["images"]],
    output:
        i2t="runs/{dataset}/{run}/qbnorm_bank_i2t.npy",
        t2i="runs/{dataset}/{run}/qbnorm_bank_t2i.npy",
    params:
        split=config["qbnorm_bank"]["split"],
        max_images=config["qbnorm_bank"]["max_images"],
    log:
        "logs/score/{dataset}_{run}_qbnorm_bank.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score-bank --run runs/{wildcards.dataset}/{wildcards.run} --split {params.split}"
        " --max-images {params.max_images} --out-i2t {output.i2t} --out-t2i {output.t2i} --no-progress > {log} 2>&1"
