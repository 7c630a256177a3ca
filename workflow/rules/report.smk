# The results report (config/report.yaml; docs/report.md), the FR scale grid (DVSE Fig. 7) and the README table.
#
#   snakemake -c2 reports/synth/report.html      # report.html (self-contained) + report.md + PNGs
#   snakemake -c2 reports/synth/summary.md       # README table: method x R@1/5/10 both ways, RSUM, train time
#   snakemake -c2 results/synth/fr_grid/dvse/val/fr_grid.json

from pathlib import Path

from xmr.planning.workflow_inputs import announce_trainings, checkpoint_recipes, planned_runs
from xmr.report.settings import doc_section, readme_parts, report_methods, report_settings, results_page
from xmr.studies.experiments import load_experiment


rule score_split:
    # any split's similarities of any run (FR is tuned on validation); the test split is rule `score`'s
    input:
        unpack(inputs_of("split")),
    output:
        "runs/{dataset}/{run}/{split}_sims.npy",
    log:
        "logs/score/{dataset}_{run}_{split}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} score --run runs/{wildcards.dataset}/{wildcards.run} --split {wildcards.split} --out {output}"
        " --no-progress > {log} 2>&1"


ruleorder: score > score_split


def fr_grid_values(wc, key):
    return " ".join(f"{v:g}" for v in report_settings(wc.dataset)["fr_grid"][key])


rule fr_grid:
    input:
        summary="runs/{dataset}/{recipe}/train.json",
        sims="runs/{dataset}/{recipe}/{split}_sims.npy",
        settings="config/report.yaml",
    output:
        json="results/{dataset}/fr_grid/{recipe}/{split}/fr_grid.json",
        csv="results/{dataset}/fr_grid/{recipe}/{split}/fr_grid.csv",
        png="results/{dataset}/fr_grid/{recipe}/{split}/fr_grid.png",
    params:
        gammas=lambda wc: fr_grid_values(wc, "gammas"),
        lambdas=lambda wc: fr_grid_values(wc, "lambdas"),
    log:
        "logs/fr_grid/{dataset}_{recipe}_{split}.log",
    resources:
        gpu=res("score", "gpu"),
        mem_mb=res("score", "mem_mb"),
        runtime=res("score", "runtime"),
        cpus_per_task=res("score", "cpus_per_task"),
    shell:
        "{XMR} fr-grid --run runs/{wildcards.dataset}/{wildcards.recipe} --sims {input.sims} --split {wildcards.split}"
        " --gammas {params.gammas} --lambdas {params.lambdas}"
        " --out-dir results/{wildcards.dataset}/fr_grid/{wildcards.recipe}/{wildcards.split} > {log} 2>&1"


def report_recipes(wc):
    return [r for r in report_methods(wc.dataset, report_settings(wc.dataset))
            if Path(recipe_path(wc.dataset, r)).exists()]


def report_inputs(wc):
    """Everything the report of a dataset shows (config/report.yaml): results of its recipes x re-rankers, the
    experiment tables, the FR grids; `xmr report` itself also works on whatever subset exists."""
    s = report_settings(wc.dataset)
    recipes = report_recipes(wc)
    experiments = [load_experiment(e) for e in s["experiments"]]
    announce_trainings(f"reports/{wc.dataset}/report.html", planned_runs(wc.dataset, recipes, experiments))
    out = [f"results/{wc.dataset}/{r}.json" if rr == "none" else f"results/{wc.dataset}/{r}_{rr}.json"
           for r in recipes for rr in s["rerank"]]
    # an imported published checkpoint (rule import_checkpoint) has no training, hence no train.json
    out += [f"runs/{wc.dataset}/{r}/train.json" for r in recipes if r not in checkpoint_recipes()]
    out += [f"results/{wc.dataset}/exp/{e}/table.md" for e in s["experiments"]
            if wc.dataset in load_experiment(e).datasets]
    out += [f"results/{wc.dataset}/fr_grid/{r}/{s['fr_grid']['split']}/fr_grid.json" for r in s["fr_grid"]["recipes"]
            if r in recipes]
    out += [f"runs/{wc.dataset}/{r}/best.pt" for r in s["subembeddings"]["recipes"] if r in recipes]
    return out + ["config/report.yaml"]


rule report:
    input:
        report_inputs,
    output:
        html="reports/{dataset}/report.html",
        md="reports/{dataset}/report.md",
    log:
        "logs/report/{dataset}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} report --dataset {wildcards.dataset} --out-dir reports/{wildcards.dataset} > {log} 2>&1"


rule report_summary:
    # the README table of a dataset's recipes (plain): summary.md has method, recalls, RSUM and training time
    input:
        lambda wc: [f"results/{wc.dataset}/{r}.json" for r in report_recipes(wc)],
    output:
        json="reports/{dataset}/summary.json",
        md="reports/{dataset}/summary.md",
        csv="reports/{dataset}/summary.csv",
    log:
        "logs/report/{dataset}_summary.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} summarize {input} --out-dir reports/{wildcards.dataset} > {log} 2>&1"


rule readme:
    # the README's results section of a dataset (config/report.yaml `readme`), pasted between its markers
    input:
        lambda wc: readme_parts(wc.dataset, report_settings(wc.dataset)),
    output:
        "reports/{dataset}/readme.md",
    log:
        "logs/report/{dataset}_readme.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} readme-section {input} --section results-{wildcards.dataset} --readme README.md --out {output}"
        " > {log} 2>&1"


rule results_page:
    # the full tables on a generated docs page (config/report.yaml `results_page`), pasted between its markers
    input:
        lambda wc: results_page(wc.dataset, report_settings(wc.dataset))[1],
    output:
        "reports/{dataset}/results_page.md",
    params:
        page=lambda wc: results_page(wc.dataset, report_settings(wc.dataset))[0],
    log:
        "logs/report/{dataset}_results_page.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} readme-section {input} --section results-{wildcards.dataset} --readme {params.page} --out {output}"
        " > {log} 2>&1"


rule doc_section:
    # a generated section of a docs page (config/report.yaml `doc_sections`), pasted between its markers
    input:
        lambda wc: doc_section(wc.dataset, report_settings(wc.dataset), wc.section)[1],
    output:
        "reports/{dataset}/doc_{section}.md",
    params:
        page=lambda wc: doc_section(wc.dataset, report_settings(wc.dataset), wc.section)[0],
    log:
        "logs/report/{dataset}_doc_{section}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} readme-section {input} --section {wildcards.section}-{wildcards.dataset} --readme {params.page}"
        " --out {output} > {log} 2>&1"


rule runs_table:
    # how each variant of an experiment trained (validation only: best RSUM, epochs, ending), one row per run
    input:
        lambda wc: [f"runs/{wc.dataset}/exp/{wc.experiment}/{v}/train.json"
                    for v in load_experiment(wc.experiment).variants],
    output:
        "reports/{dataset}/runs_{experiment}.md",
    log:
        "logs/report/{dataset}_runs_{experiment}.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} show runs/{wildcards.dataset}/exp/{wildcards.experiment}/ --out {output} > {log} 2>&1"


rule demo_table:
    # what `make demo` prints: `xmr show` of the default targets (config `default`)
    input:
        lambda wc: expand("results/{dataset}/{target}.json", dataset=wc.dataset, target=config["default"]["targets"]),
    output:
        "reports/{dataset}/demo.md",
    log:
        "logs/report/{dataset}_demo.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} show {input} --out {output} > {log} 2>&1"


rule readme_demo:
    # the README's demo section (`<!-- xmr:demo-{dataset} -->`): exactly the table `make demo` prints
    input:
        "reports/{dataset}/demo.md",
    output:
        "reports/{dataset}/readme_demo.md",
    log:
        "logs/report/{dataset}_readme_demo.log",
    resources:
        mem_mb=res("light", "mem_mb"),
        runtime=res("light", "runtime"),
        cpus_per_task=res("light", "cpus_per_task"),
    shell:
        "{XMR} readme-section {input} --section demo-{wildcards.dataset} --readme README.md --out {output}"
        " > {log} 2>&1"
