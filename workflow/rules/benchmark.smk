# The seeded benchmark (config/benchmark/{bench}.yaml; xmr/studies/benchmark.py, docs/benchmark.md): every variant x
# seed is a run (run key bench/{bench}/{variant}/s{seed}) trained, scored and evaluated by the one chain (train.smk,
# evaluate.smk), plain and with each re-ranker into one results file per run, then gathered into
# results/{dataset}/{bench}.md (+ .csv/.json/.png) and the claims table results/{dataset}/{bench}_claims.md.
#
#   snakemake -c2 results/synth/benchmark.md

from xmr.planning.workflow_inputs import announce_trainings
from xmr.studies.benchmark import benchmark_names, load_benchmark
from xmr.studies.claims import joint_family_benchmarks


wildcard_constraints:
    # only the names of config/benchmark/*.yaml: results/{dataset}/{bench}.json must not shadow a recipe's results
    bench="|".join(benchmark_names()) or "(?!)",


def bench_of(wc):
    bench = load_benchmark(f"config/benchmark/{wc.bench}.yaml")
    if bench.dataset != wc.dataset:
        raise ValueError(f"benchmark {wc.bench} is for dataset {bench.dataset}, not {wc.dataset}")
    return bench


def benchmark_results(wc):
    # its own runs and those of the other files with claims in its Holm families (adjusted as one family)
    benches = [bench_of(wc)] + joint_family_benchmarks(bench_of(wc))
    announce_trainings(f"results/{wc.dataset}/{wc.bench}.md",
                       sorted({b.run_dir(v, s) for b in benches for v in b.variants for s in b.seeds}))
    return sorted({str(p) for b in benches for p in b.results()})


rule benchmark_table:
    input:
        benchmark="config/benchmark/{bench}.yaml",
        results=lambda wc: benchmark_results(wc),
    output:
        md="results/{dataset}/{bench}.md",
        csv="results/{dataset}/{bench}.csv",
        json="results/{dataset}/{bench}.json",
        png="results/{dataset}/{bench}.png",
        curves="results/{dataset}/{bench}_curves.png",
        claims="results/{dataset}/{bench}_claims.md",
        claims_csv="results/{dataset}/{bench}_claims.csv",
        training="results/{dataset}/{bench}_training.md",
    log:
        "logs/bench/{dataset}_{bench}_table.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} benchmark-table --benchmark {input.benchmark} > {log} 2>&1"
