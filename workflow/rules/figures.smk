# The seed papers' analysis figures of trained runs (`xmr figure`; docs/report.md "Analysis figures"):
# reports/{dataset}/figures/{runs}/{kind}.png, {runs} a run key below runs/{dataset}/ (a recipe, or
# exp/EXPERIMENT/VARIANT), two or more joined by "+".
#
#   snakemake -c2 reports/synth/figures/exp/dive_figures/small/tsne.png       # DivE Fig. A1, CODER Fig. 3
#   snakemake -c2 reports/synth/figures/exp/dive_figures/small/slots.png      # DivE Figs. 4, A2, A3
#   snakemake -c2 reports/synth/figures/dvse_demo/regions.png                 # DVSE Fig. 10
#   snakemake -c2 reports/synth/figures/dvse_demo+exp/dive_figures/small/compare.png   # DVSE Figs. 11-12
#   snakemake -c2 reports/synth/figures/exp/vse_2ad_adopt/adopt/curves_train_k.png     # VSE+2AD Fig. C-2


wildcard_constraints:
    column="[a-z0-9_]+",


def runs_of(wc):
    return [f"runs/{wc.dataset}/{r}" for r in wc.runs.split("+")]


rule figure_tsne:
    input:
        lambda wc: [f"{r}/best.pt" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/{runs}/tsne.png",
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
        "reports/{dataset}/figures/{runs}/{kind}.png",
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
        "reports/{dataset}/figures/{runs}/compare.png",
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
        "reports/{dataset}/figures/{runs}/curves_{column}.png",
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
