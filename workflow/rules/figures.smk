# The seed papers' analysis figures of trained runs (`xmr figure`; docs/report.md "Analysis figures"):
# reports/{dataset}/figures/{runs}/{kind}.png, {runs} a run key below runs/{dataset}/ (a recipe, or
# exp/EXPERIMENT/VARIANT), two or more joined by "+".
#
#   snakemake -c2 reports/synth/figures/exp/dive_figures/small/tsne.png       # DivE Fig. A1
#   snakemake -c2 reports/f30k/figures/coder/tsne_instance.png               # CODER Fig. 3
#   snakemake -c2 reports/synth/figures/exp/dive_figures/small/slots.png      # DivE Figs. 4, A2, A3
#   snakemake -c2 reports/synth/figures/dvse_demo/regions.png                 # DVSE Fig. 10
#   snakemake -c2 reports/synth/figures/dvse_demo+exp/dive_figures/small/compare_t2i.png   # DVSE Fig. 11
#   snakemake -c2 reports/synth/figures/dvse_demo+exp/dive_figures/small/compare_i2t.png   # DVSE Fig. 12
#   snakemake -c2 reports/synth/figures/exp/vse_2ad_adopt/adopt/curves_train_k.png     # VSE+2AD Fig. C-2


wildcard_constraints:
    column="[a-z0-9_]+",


def runs_of(wc):
    return [f"runs/{wc.dataset}/{r}" for r in wc.runs.split("+")]


# tsne: 100 test images and one caption each, every set element (DivE Fig. A1); tsne_instance: 1,000 images, all
# their captions, each set's first element (CODER Fig. 3: its instance embeddings, F30K's 1,000 x 5,000)
TSNE_OPTIONS = {"tsne": "", "tsne_instance": "--images 1000 --all-captions --element 0"}


rule figure_tsne:
    input:
        lambda wc: [f"{r}/best.pt" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/{runs}/{tsne}.png",
    wildcard_constraints:
        tsne="tsne|tsne_instance",
    params:
        runs=lambda wc: " ".join(runs_of(wc)),
        options=lambda wc: TSNE_OPTIONS[wc.tsne],
    log:
        "logs/figures/{dataset}_{tsne}_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure tsne --run {params.runs} {params.options} --out {output} > {log} 2>&1"


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
    # t2i: DVSE Fig. 11's top 4 images per caption; i2t: Fig. 12's top 5 captions per image
    input:
        lambda wc: [f"{r}/test_sims.npy" for r in runs_of(wc)],
    output:
        "reports/{dataset}/figures/{runs}/compare_{direction}.png",
    wildcard_constraints:
        direction="t2i|i2t",
    params:
        runs=lambda wc: " ".join(runs_of(wc)),
        sims=lambda wc: " ".join(f"{r}/test_sims.npy" for r in runs_of(wc)),
        top_k=lambda wc: {"t2i": 4, "i2t": 5}[wc.direction],
    log:
        "logs/figures/{dataset}_compare_{direction}_{runs}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} figure compare --run {params.runs} --sims {params.sims} --direction {wildcards.direction}"
        " --top-k {params.top_k} --out {output} > {log} 2>&1"


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


# DivE Table 5: a run scored with some set elements left out ({side} image or caption, {mode} keep or drop, a
# 0-based element {index}), evaluated, and the table of those evaluations beside the whole-set one
#
#   snakemake -c2 reports/synth/elements/exp/dive_figures/small.md


wildcard_constraints:
    side="image|caption",
    mode="keep|drop",
    index="[0-9]+",

# the rows of DivE Table 5 for K = 4: only S(i) for each element, and all but S^V(2), on each side
TABLE5 = [f"{side}_keep_{i}" for side in ("image", "caption") for i in range(4)] + ["image_drop_1"]


rule score_elements:
    input:
        "runs/{dataset}/{run}/best.pt",
    output:
        "runs/{dataset}/{run}/test_sims_{side}_{mode}_{index}.npy",
    params:
        flag=lambda wc: f"--{'drop-' if wc.mode == 'drop' else ''}{wc.side}-elements {wc.index}",
    log:
        "logs/score/{dataset}_{run}_{side}_{mode}_{index}.log",
    resources:
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/{wildcards.run} {params.flag} --out {output} --no-progress"
        " > {log} 2>&1"


rule evaluate_elements:
    # {row}: all (the whole sets: the run's test_sims.npy) or {side}_{mode}_{index}; named by the file in the table
    input:
        lambda wc: f"runs/{wc.dataset}/{wc.run}/test_sims" + ("" if wc.row == "all" else f"_{wc.row}") + ".npy",
    output:
        "results/{dataset}/elements/{run}/{row}.json",
    wildcard_constraints:
        row="all|(image|caption)_(keep|drop)_[0-9]+",
    log:
        "logs/evaluate/{dataset}_elements_{run}_{row}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} test --run runs/{wildcards.dataset}/{wildcards.run} --sims {input} --no-tracking --out {output}"
        " > {log} 2>&1"


ruleorder: evaluate_elements > evaluate


rule elements_table:
    input:
        lambda wc: [f"results/{wc.dataset}/elements/{wc.run}/{row}.json" for row in ["all", *TABLE5]],
    output:
        "reports/{dataset}/elements/{run}.md",
    log:
        "logs/report/{dataset}_elements_{run}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} show {input} --name-by file --out {output} > {log} 2>&1"


rule set_statistics_table:
    # DVSE Fig. 6's correlation and DivE Table 3's circular variance of results files ({targets} joined by "+")
    input:
        lambda wc: [f"results/{wc.dataset}/{t}.json" for t in wc.targets.split("+")],
    output:
        "reports/{dataset}/set_statistics/{targets}.md",
    log:
        "logs/report/{dataset}_set_statistics_{targets}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} show {input} --set-statistics --out {output} > {log} 2>&1"
