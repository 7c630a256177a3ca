# The seeded benchmark (config/benchmark/{bench}.yaml; xmr/benchmark.py, docs/benchmark.md): every variant trained
# with every seed into runs/{dataset}/bench/{bench}/{variant}/s{seed}/, evaluated plain and with each re-ranker
# into one results file per run, then gathered into results/{dataset}/{bench}.md (+ .csv/.json/.png) and the
# claims table results/{dataset}/{bench}_claims.md.
#
#   snakemake -c2 results/synth/benchmark.md

from xmr.benchmark import benchmark_names, load_benchmark


wildcard_constraints:
    # only the names of config/benchmark/*.yaml: results/{dataset}/{bench}.json must not shadow a recipe's results
    bench="|".join(benchmark_names()) or "(?!)",
    seed="[0-9]+",


def bench_of(wc):
    bench = load_benchmark(f"config/benchmark/{wc.bench}.yaml")
    if bench.dataset != wc.dataset:
        raise ValueError(f"benchmark {wc.bench} is for dataset {bench.dataset}, not {wc.dataset}")
    return bench


def bench_recipe(wc):
    return bench_of(wc).variants[wc.variant]["recipe"]


def bench_threads(wc):
    """The run's train.threads when the benchmark sets it (two 1-thread trainings on 2 cores), else the resources'."""
    return bench_of(wc).run_config(wc.variant, int(wc.seed))["train"]["threads"] or res("train", "cpus_per_task")(wc)


def bench_run(wc):
    return str(bench_of(wc).run_dir(wc.variant, int(wc.seed)))


rule bench_train:
    input:
        benchmark="config/benchmark/{bench}.yaml",
        config=lambda wc: str(bench_of(wc).recipe_path(wc.variant)),
        images=lambda wc: recipe_image_inputs(wc.dataset, bench_recipe(wc), "train"),
        text_features=lambda wc: recipe_text_feature_files(wc.dataset, bench_recipe(wc))["train"],
    output:
        ckpt="runs/{dataset}/bench/{bench}/{variant}/s{seed}/best.pt",
        summary="runs/{dataset}/bench/{bench}/{variant}/s{seed}/train.json",
    params:
        run=bench_run,
        overrides=lambda wc: " ".join(f"'{o}'" for o in bench_of(wc).train_overrides(wc.variant, int(wc.seed))),
    log:
        "logs/bench/{dataset}_{bench}_{variant}_s{seed}_train.log",
    threads: bench_threads
    resources:
        gpu=res("train", "gpu"),
        mem_mb=res("train", "mem_mb"),
        runtime=res("train", "runtime"),
        cpus_per_task=bench_threads,
    shell:
        "{XMR} train --config {input.config} --out-dir {params.run} --set {params.overrides} --no-progress"
        " > {log} 2>&1"


rule bench_score:
    input:
        ckpt="runs/{dataset}/bench/{bench}/{variant}/s{seed}/best.pt",
        images=lambda wc: recipe_image_inputs(wc.dataset, bench_recipe(wc), "score"),
        text_features=lambda wc: recipe_text_feature_files(wc.dataset, bench_recipe(wc))["score"],
    output:
        "runs/{dataset}/bench/{bench}/{variant}/s{seed}/test_sims.npy",
    params:
        run=bench_run,
    log:
        "logs/bench/{dataset}_{bench}_{variant}_s{seed}_score.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run {params.run} --out {output} --no-progress > {log} 2>&1"


rule bench_evaluate:
    input:
        sims="runs/{dataset}/bench/{bench}/{variant}/s{seed}/test_sims.npy",
    output:
        "results/{dataset}/bench/{bench}/{variant}/s{seed}.json",
    params:
        run=bench_run,
        reranks=lambda wc: " ".join(bench_of(wc).rerank),
    log:
        "logs/bench/{dataset}_{bench}_{variant}_s{seed}_evaluate.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run {params.run} --sims {input.sims} --reranks {params.reranks} --out {output} > {log} 2>&1"


rule benchmark_table:
    input:
        benchmark="config/benchmark/{bench}.yaml",
        results=lambda wc: [str(p) for p in bench_of(wc).results()],
    output:
        md="results/{dataset}/{bench}.md",
        csv="results/{dataset}/{bench}.csv",
        json="results/{dataset}/{bench}.json",
        png="results/{dataset}/{bench}.png",
        curves="results/{dataset}/{bench}_curves.png",
        claims="results/{dataset}/{bench}_claims.md",
        claims_csv="results/{dataset}/{bench}_claims.csv",
    log:
        "logs/bench/{dataset}_{bench}_table.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} benchmark-table --benchmark {input.benchmark} > {log} 2>&1"
