# The seed papers' analysis figures of trained runs (`xmr figure`; docs/report.md "Analysis figures"). {run} is a
# run key below runs/{dataset}/ (a recipe, or exp/EXPERIMENT/VARIANT); two or more runs are joined by "+".
#
#   snakemake -c2 reports/synth/figures/tsne/exp/dive_figures/small.png       # DivE Fig. A1, CODER Fig. 3
#   snakemake -c2 reports/synth/figures/slots/exp/dive_figures/small.png      # DivE Figs. 4, A2, A3
#   snakemake -c2 reports/synth/figures/regions/dvse_demo.png                 # DVSE Fig. 10
#   snakemake -c2 reports/synth/figures/compare/dvse_demo+exp/dive_figures/small.png   # DVSE Figs. 11-12
#   snakemake -c2 reports/synth/figures/curves_train_k/exp/vse_2ad_adopt/adopt.png     # VSE+2AD Fig. C-2


wildcard_constraints:
    column="[a-z0-9_]+",


def runs_of(wc):
    return [f"runs/{wc.dataset}/{r}" for r in wc.runs.split("+")]


rule figure_tsne:
    input:
        lambda wc: [f"{r}/best.pt" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/tsne/{runs}.png",
    params:
        runs=lambda wc: " ".join(runs_of(wc)),
    log:
        "logs/figures/{dataset}_tsne_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure tsne --run {params.runs} --out {output} > {log} 2>&1"


rule figure_maps:
    # slots: each sub-embedding's attention and its nearest test caption; regions: regions ranked by cosine
    input:
        "runs/{dataset}/{runs}/best.pt",
    output:
        "reports/{dataset}/figures/{kind}/{runs}.png",
    wildcard_constraints:
        kind="slots|regions",
    params:
        how=lambda wc: "--weights attention --captions" if wc.kind == "slots" else "--weights similarity",
    log:
        "logs/figures/{dataset}_{kind}_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure maps --run runs/{wildcards.dataset}/{wildcards.runs} {params.how} --out {output} > {log} 2>&1"


rule figure_compare:
    input:
        lambda wc: [f"{r}/test_sims.npy" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/compare/{runs}.png",
    params:
        runs=lambda wc: " ".join(runs_of(wc)),
        sims=lambda wc: " ".join(f"{r}/test_sims.npy" for r in runs_of(wc)),
    log:
        "logs/figures/{dataset}_compare_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure compare --run {params.runs} --sims {params.sims} --out {output} > {log} 2>&1"


rule figure_curves:
    input:
        lambda wc: [f"{r}/train.json" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/curves_{column}/{runs}.png",
    params:
        runs=lambda wc: " ".join(runs_of(wc)),
    log:
        "logs/figures/{dataset}_curves_{column}_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure curves --run {params.runs} --column {wildcards.column} --out {output} > {log} 2>&1"
